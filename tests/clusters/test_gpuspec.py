"""The GPU spec grammar (docs/rules.md#resources-and-gpu-requests), the seed catalog, and GPU-equivalents."""

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.clusters.catalog import GPU_CATALOG
from apps.clusters.gpuspec import (
    MAX_COUNT,
    NO_GPU,
    Catalog,
    GPURequest,
    GPUSpecError,
    candidate_models,
    equivalents,
    format_gpu_spec,
    parse_gpu_spec,
)

CATALOG = Catalog.default()
D = Decimal


def parse(text):
    return parse_gpu_spec(text, CATALOG)


# --- the grammar examples of docs/rules.md ---------------------------------------------------------


def test_whole_cards_of_an_ambiguous_alias_mean_any_of_its_models():
    assert parse("2(V100)") == GPURequest(count=D(2), models=("V100-16G", "V100-32G"), shared=False)


def test_a_bar_lists_alternative_models():
    assert parse("1(A100|H100)") == GPURequest(count=D(1), models=("A100-80G", "H100"), shared=False)


def test_aliases_are_case_insensitive():
    assert parse("4(ascend910b)").models == ("Ascend910B",)
    assert parse("4(ASCEND-910B)").models == ("Ascend910B",)
    assert parse("4(910B)").models == ("Ascend910B",)


def test_half_a_vgpu_is_half_of_any_shareable_card():
    req = parse("0.5(vgpu)")
    assert req == GPURequest(count=D("0.5"), models=(), shared=True)
    assert req.is_fractional and not req.is_none


def test_half_a_t4():
    assert parse("0.5(T4)") == GPURequest(count=D("0.5"), models=("T4",), shared=True)


def test_memory_and_compute_share_of_one_card():
    req = parse("1(16G,50%)")
    assert req == GPURequest(count=D(1), shared=True, vram_gib=D(16), cores_percent=50)
    assert not req.is_fractional


def test_vendor_neutral_totals():
    req = parse("vram=16Gi,tflops-fp16=100")
    assert req.is_vendor_neutral
    assert (req.min_vram_gib, req.min_tflops_fp16, req.min_tflops_fp32) == (D(16), D(100), None)
    assert req.count == 1 and req.models == ()


@pytest.mark.parametrize(
    ("text", "gib"),
    [("vram=16G", D(16)), ("vram=16GiB", D(16)), ("vram=512Mi", D("0.5")), ("vram=1.5gi", D("1.5"))],
)
def test_vendor_neutral_vram_units(text, gib):
    assert parse(text).min_vram_gib == gib


def test_vendor_neutral_fp32_and_underscored_keys():
    req = parse(" TFLOPS_FP32 = 20 , vram=8Gi ")
    assert (req.min_vram_gib, req.min_tflops_fp32) == (D(8), D(20))


def test_a_bare_count_is_whole_cards_of_any_model():
    assert parse("1") == GPURequest(count=D(1), models=(), shared=False)


@pytest.mark.parametrize("text", ["0", "", "   ", None, "0.00"])
def test_zero_empty_and_none_mean_no_accelerator(text):
    req = parse(text)
    assert req == NO_GPU and req.is_none


def test_surrounding_and_inner_whitespace_is_tolerated():
    assert parse("  2 ( a100 | h100 )  ") == parse("2(A100|H100)")


def test_shared_whole_card_is_spelled_with_vgpu():
    assert parse("1(T4, vgpu)") == GPURequest(count=D(1), models=("T4",), shared=True)
    assert parse("1(vgpu)") == GPURequest(count=D(1), shared=True)


def test_a_bare_fraction_is_a_vgpu_share():
    assert parse("0.25") == parse("0.25(vgpu)")


def test_without_catalog_models_are_kept_as_written():
    assert parse_gpu_spec("2(v100|X9)").models == ("X9", "v100")
    assert parse_gpu_spec("0.5(MI300X)").shared


def test_counts_with_trailing_zeros_are_the_same_request():
    assert parse("2.00(T4)") == parse("2(T4)")


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("2(V100)", "2(V100-16G|V100-32G)"),
        ("1(h100|a100)", "1(A100-80G|H100)"),
        ("0.5", "0.5(vgpu)"),
        ("0.50(t4)", "0.5(T4)"),
        ("1(50%, 16GiB)", "1(16G,50%)"),
        ("2(t4,vgpu)", "2(T4,vgpu)"),
        ("1(a10,1536Mi)", "1(A10,1.5G)"),
        ("tflops-fp16=100, vram=16G", "vram=16Gi,tflops-fp16=100"),
        ("vram=100Mi", "vram=100Mi"),
        ("", "0"),
        ("3", "3"),
    ],
)
def test_format_gives_the_canonical_spelling(text, canonical):
    assert format_gpu_spec(parse(text)) == canonical
    assert str(parse(text)) == canonical


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("2x(V100)", "expected a count such as 2 or 0.5 before '(' in '2x(V100)'"),
        ("(V100)", "expected a count such as 2 or 0.5 before '('"),
        ("1.5(A100)", "expected a whole number of cards or a fraction below 1, got 1.5"),
        ("1.5", "expected a whole number of cards or a fraction below 1"),
        ("-1(A100)", "expected a count of 0 or more, got '-1'"),
        ("-2", "expected a count of 0 or more"),
        ("65(A100)", f"expected at most {MAX_COUNT} cards, got 65"),
        ("0.125(T4)", "expected at most 2 decimal places in the count, got '0.125'"),
        ("2()", "expected a model name, vgpu or a share such as 16G,50% inside '()'"),
        ("2(  )", "inside '()'"),
        ("2(V100", "expected ')' to close '(' in '2(V100'"),
        ("2V100)", "unexpected ')' without a matching '('"),
        ("2((V100))", "unexpected second '('"),
        ("2(V100))", "unexpected second ')'"),
        ("2(V100)x", "expected nothing after ')', got 'x'"),
        ("0(A100)", "expected a count above 0 with a model list or a share; write 0 for no accelerator"),
        ("0(vgpu)", "expected a count above 0"),
        ("2(X100)", "unknown GPU model 'X100' in '2(X100)'; known models include"),
        ("2(a10O)", "known models include A10"),
        ("0.5(MI300X)", "expected a shareable model for a fraction or a share; MI300X is not shareable"),
        ("1(MLU370,8G)", "MLU370 is not shareable"),
        ("1(Ascend910A,vgpu)", "Ascend910A is not shareable"),
        ("1(16G,150%)", "expected a whole percent from 1 to 100, got '150%'"),
        ("1(16G,0%)", "expected a whole percent from 1 to 100, got '0%'"),
        ("1(16G,12.5%)", "expected a whole percent from 1 to 100"),
        ("1(-5%)", "expected a whole percent from 1 to 100"),
        ("1(16G,8G)", "expected one memory size, got a second '8G'"),
        ("1(50%,20%)", "expected one compute share, got a second '20%'"),
        ("1(vgpu,vgpu)", "expected vgpu once"),
        ("1(0G)", "expected a memory size above 0"),
        ("1(16,50%)", "expected a size with a unit such as 16G, got '16'"),
        ("1(T4,24G)", "expected at most 16 GiB per card for T4, got 24 GiB"),
        ("0.5(16G)", "expected either a fraction or a memory/compute share, not both"),
        ("2(8G)", "expected a count of 1 with a memory/compute share (a share is part of one card), got 2"),
        ("1(A100,H100)", "expected models separated by '|', not ','"),
        ("1(A100|)", "expected a model name on each side of '|'"),
        ("1(A100,,50%)", "expected an item between commas"),
        ("1(T4|vgpu)", "expected vgpu after a comma, such as 1(T4,vgpu)"),
        ("1(A100!)", "expected a model name such as A100, got 'A100!'"),
        ("A100", "expected a count before the model, such as 1(A100)"),
        ("#", "expected a count such as 2, a form such as 2(V100), or key=value pairs"),
        ("vram=16Gi,vram=8Gi", "duplicate key 'vram'"),
        ("tflops-fp16=1,tflops_fp16=2", "duplicate key 'tflops-fp16'"),
        ("vram=16Gi,color=red", "unknown key 'color'"),
        ("vram=16Gi,color=red", "expected vram, tflops-fp16 or tflops-fp32"),
        ("vram=16", "expected a size such as 16Gi for vram, got '16'"),
        ("vram=16Ti", "expected a size such as 16Gi for vram"),
        ("tflops-fp16=lots", "expected a number such as 100 for tflops-fp16, got 'lots'"),
        ("tflops-fp16=0", "expected tflops-fp16 above 0"),
        ("vram=0.125Gi", "expected at most 2 decimal places in a size"),
        ("vram=", "expected key=value, got 'vram='"),
        ("vram=16Gi,", "expected key=value between commas"),
        ("vram=16Gi,tflops-fp16", "expected key=value, got 'tflops-fp16'"),
        ("2(A100),vram=16Gi", "expected either a form like 2(V100) or key=value pairs, not both"),
        ("vram=1000Gi,tflops-fp16=100000", "expected totals that some catalog model meets with at most 64 cards"),
    ],
)
def test_bad_specs_say_what_was_expected(text, fragment):
    with pytest.raises(GPUSpecError) as caught:
        parse(text)
    assert fragment in str(caught.value)


def test_gpu_spec_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse("2x(V100)")


def test_an_empty_catalog_says_so_for_unknown_models():
    with pytest.raises(GPUSpecError, match="the catalog is empty"):
        parse_gpu_spec("1(A100)", Catalog([]))


@pytest.mark.parametrize(
    "fields",
    [
        {"count": D(-1)},
        {"count": D("1.5")},
        {"count": D("0.5")},  # a fraction must be shared
        {"count": D(0), "models": ("T4",)},
        {"count": D(1), "shared": True, "cores_percent": 101},
        {"count": D(2), "min_vram_gib": D(16)},
        {"count": D(1), "models": ("bad|name",)},
    ],
)
def test_requests_that_no_spec_can_express_cannot_be_built(fields):
    with pytest.raises(GPUSpecError):
        GPURequest(**{"models": (), "shared": False, **fields})


# --- the catalog ------------------------------------------------------------------------------

CATALOG_KEYS = {
    "name",
    "vendor",
    "aliases",
    "vram_gib",
    "tflops_fp16",
    "tflops_fp32",
    "exchange_rate",
    "resource_name",
    "visible_devices_env",
    "shareable",
    "slurm_gres_type",
    "memory_bandwidth_gbps",  # loaded by 0010_device_fingerprint, not 0002
}


def test_every_seed_entry_has_exactly_the_migration_keys():
    for entry in GPU_CATALOG:
        assert set(entry) == CATALOG_KEYS, entry["name"]


def test_seed_exchange_rates():
    rates = {name: CATALOG.rate(name) for name in CATALOG.names}
    assert rates["A100-80G"] == 1.0
    assert rates["A800-80G"] == 0.7
    assert rates["Ascend910B"] == 0.6
    assert rates["Ascend910A"] == 0.5
    assert rates["DCU-Z100"] == 0.4
    assert rates["MLU370"] == 0.35


def test_derived_rates_are_dense_fp16_relative_to_the_a100():
    seeded = {"A100-80G", "A800-80G", "Ascend910B", "Ascend910A", "DCU-Z100", "MLU370"}
    for entry in CATALOG:
        if entry.name not in seeded and not entry.partition:  # MIG profiles: tests/clusters/test_device_sharing.py
            assert entry.exchange_rate == round(entry.tflops_fp16 / 312, 2), entry.name


@pytest.mark.parametrize(
    ("token", "names"),
    [
        ("v100", ("V100-16G", "V100-32G")),
        ("V100_32G", ("V100-32G",)),
        ("a100", ("A100-80G",)),
        ("h100", ("H100",)),
        ("ascend910b", ("Ascend910B",)),
        ("910b", ("Ascend910B",)),
        ("z100", ("DCU-Z100",)),
        ("mlu370", ("MLU370",)),
        ("MI 300X", ("MI300X",)),
        ("A10", ("A10",)),
        ("nope", ()),
    ],
)
def test_resolve_all(token, names):
    assert CATALOG.resolve_all(token) == names


def test_resolve_gives_none_for_unknown_and_ambiguous_aliases():
    assert CATALOG.resolve("a-100") == "A100-80G"
    assert CATALOG.resolve("v100") is None
    assert CATALOG.resolve("nope") is None


def test_entry_shareable_and_rate_accept_aliases():
    assert CATALOG.entry("t4").name == "T4"
    assert CATALOG.shareable("h100") and not CATALOG.shareable("mi300x")
    assert CATALOG.rate("910b") == 0.6
    with pytest.raises(KeyError):
        CATALOG.entry("v100")


def test_catalog_accepts_objects_and_skips_disabled_models():
    class Row:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    catalog = Catalog(
        [
            Row(
                name="X1",
                vendor="intel",
                aliases="x-one, xone",
                vram_gib=D(48),
                tflops_fp16=D(100),
                tflops_fp32=D(0),
                exchange_rate=D("0.3"),
                shareable=False,
                enabled=True,
            ),
            Row(
                name="X2",
                vendor="intel",
                aliases=[],
                vram_gib=D(48),
                tflops_fp16=D(100),
                tflops_fp32=D(0),
                exchange_rate=D("0.3"),
                shareable=False,
                enabled=False,
            ),
        ]
    )
    assert catalog.names == ["X1"]
    assert catalog.resolve("XONE") == "X1"


def test_a_catalog_rejects_a_name_that_is_another_models_alias():
    with pytest.raises(ValueError, match="also an alias"):
        Catalog([{"name": "A", "aliases": ["b"]}, {"name": "B", "aliases": []}])


# --- GPU-equivalents and candidates ----------------------------------------------------------


def test_equivalents_are_count_times_rate_of_the_model():
    assert equivalents(parse("2(V100)"), CATALOG, "V100-32G") == D("0.8")
    assert equivalents(parse("4(910b)"), CATALOG, "Ascend910B") == D("2.4")
    assert equivalents(parse("0.5(vgpu)"), CATALOG, "A100-80G") == D("0.5")
    assert equivalents(NO_GPU, CATALOG) == 0


def test_equivalents_of_a_share_are_the_larger_of_its_core_and_memory_share():
    assert equivalents(parse("1(16G,50%)"), CATALOG, "A100-80G") == D("0.5")
    assert equivalents(parse("1(40G,25%)"), CATALOG, "A100-80G") == D("0.5")
    assert equivalents(parse("1(8G)"), CATALOG, "T4") == D("0.105")
    assert equivalents(parse("1(10G)"), CATALOG, "A10") == D("0.417") * D("0.4")  # rounded up to 1/1000 card


def test_equivalents_without_a_model_take_the_cheapest_allowed_model():
    assert equivalents(parse("1(A100|H100)"), CATALOG) == D(1)
    assert equivalents(parse("vram=160Gi,tflops-fp16=1000"), CATALOG) == D("2.4")  # 4 x Ascend910B


def test_equivalents_of_vendor_neutral_use_the_cheapest_count_of_that_model():
    req = parse("vram=160Gi,tflops-fp16=1000")
    assert equivalents(req, CATALOG, "H100") == 2 * D("3.17")  # 2 x 989.4 TFLOPS, 2 x 80 GiB
    assert equivalents(req, CATALOG, "A100-80G") == 4  # 1000 / 312 -> 4 cards


def test_equivalents_reject_a_model_the_request_cannot_land_on():
    with pytest.raises(GPUSpecError, match="cannot satisfy"):
        equivalents(parse("2(V100)"), CATALOG, "H100")
    with pytest.raises(GPUSpecError, match="cannot satisfy"):
        equivalents(parse("tflops-fp32=10"), CATALOG, "DCU-Z100")


def test_candidates_of_a_model_list_are_those_models():
    assert candidate_models(parse("2(V100)"), CATALOG) == [("V100-16G", D(2)), ("V100-32G", D(2))]


def test_candidates_of_a_fraction_are_shareable_models_only_cheapest_first():
    found = candidate_models(parse("0.5(vgpu)"), CATALOG)
    names = [name for name, _ in found]
    assert names[0] == "T4"
    assert all(CATALOG.shareable(name) for name in names)
    assert "MI300X" not in names and len(names) == sum(entry.shareable for entry in CATALOG)
    assert {count for _, count in found} == {D("0.5")}


def test_candidates_of_a_share_need_enough_vram_per_card():
    names = {name for name, _ in candidate_models(parse("1(40G)"), CATALOG)}
    assert "T4" not in names and "A10" not in names and "A100-80G" in names


def test_candidates_of_vendor_neutral_are_the_smallest_count_per_model():
    found = dict(candidate_models(parse("vram=160Gi,tflops-fp16=1000"), CATALOG))
    assert found["H100"] == 2
    assert found["MI300X"] == 1
    assert found["A100-80G"] == 4
    assert found["T4"] == 16  # 1000 / 65 -> 16 cards (and 256 GiB)
    assert "DCU-Z100" not in found  # no published FP16 figure


def test_candidates_skip_models_that_would_need_more_than_64_cards():
    found = dict(candidate_models(parse("tflops-fp16=5000"), CATALOG))
    assert "T4" not in found  # 77 cards
    assert found["MI300X"] == 4


def test_a_request_parsed_without_catalog_still_finds_its_models():
    assert candidate_models(parse_gpu_spec("1(v100)"), CATALOG) == [("V100-16G", D(1)), ("V100-32G", D(1))]


def test_no_accelerator_has_no_candidates():
    assert candidate_models(NO_GPU, CATALOG) == []


# --- round trips ------------------------------------------------------------------------------

SHAREABLE = [entry for entry in CATALOG if entry.shareable]
decimals2 = st.integers(min_value=1, max_value=99).map(lambda n: D(n) / 100)
whole_counts = st.integers(min_value=1, max_value=MAX_COUNT).map(D)


def _sizes(max_gib):
    return st.integers(min_value=1, max_value=int(max_gib * 100)).map(lambda n: D(n) / 100)


@st.composite
def requests(draw):
    """Valid requests against the default catalog."""
    kind = draw(st.sampled_from(["none", "whole", "fraction", "share", "neutral"]))
    if kind == "none":
        return NO_GPU
    if kind == "whole":
        shared = draw(st.booleans())
        pool = SHAREABLE if shared else list(CATALOG)
        models = draw(st.lists(st.sampled_from([e.name for e in pool]), max_size=4, unique=True))
        return GPURequest(count=draw(whole_counts), models=tuple(models), shared=shared)
    if kind == "fraction":
        models = draw(st.lists(st.sampled_from([e.name for e in SHAREABLE]), max_size=3, unique=True))
        return GPURequest(count=draw(decimals2), models=tuple(models), shared=True)
    if kind == "share":
        chosen = draw(st.lists(st.sampled_from(SHAREABLE), max_size=3, unique_by=lambda e: e.name))
        max_gib = min((e.vram_gib for e in chosen), default=D(80))
        vram = draw(st.none() | _sizes(max_gib))
        percent = draw(st.none() | st.integers(min_value=1, max_value=100))
        if vram is None and percent is None:
            percent = 100
        return GPURequest(
            count=D(1),  # a share is part of one card
            models=tuple(e.name for e in chosen),
            shared=True,
            vram_gib=vram,
            cores_percent=percent,
        )
    vram = draw(st.none() | _sizes(1000))
    fp16 = draw(st.none() | _sizes(5000))
    fp32 = draw(st.none() | _sizes(500))
    if vram is fp16 is fp32 is None:
        vram = D(16)
    return GPURequest(count=D(1), min_vram_gib=vram, min_tflops_fp16=fp16, min_tflops_fp32=fp32)


def _jumble_case(draw, text):
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c.lower() for c, flip in zip(text, flips, strict=True))


def _ws(draw):
    return draw(st.sampled_from(["", " ", "  ", "\t"]))


def _spell_model(draw, name):
    tokens = [name, *(a for a in CATALOG.entry(name).aliases if CATALOG.resolve(a) == name)]
    token = draw(st.sampled_from(tokens))
    token = token.replace("-", draw(st.sampled_from(["-", "_", " ", ""])))
    return _jumble_case(draw, token)


def _spell_size(draw, gib):
    unit = draw(st.sampled_from(["G", "Gi", "GiB", "g", "gib", "Mi", "MiB", "m"]))
    value = gib * 1024 if unit.lower().startswith("m") else gib
    return f"{format(value.normalize(), 'f')}{_ws(draw)}{unit}"


def _spell_count(draw, count):
    text = format(count.normalize(), "f")
    if "." not in text and draw(st.booleans()):
        text += draw(st.sampled_from([".0", ".00"]))
    return text


@st.composite
def spellings(draw):
    """A request and one of the many ways a user might type it."""
    req = draw(requests())
    if req.is_none:
        return req, draw(st.sampled_from(["", "0", " 0 ", "0.0", "0.00"]))
    if req.is_vendor_neutral:
        pairs = []
        if req.min_vram_gib is not None:
            pairs.append(("vram", _spell_size(draw, req.min_vram_gib)))
        for key, value in (("tflops-fp16", req.min_tflops_fp16), ("tflops-fp32", req.min_tflops_fp32)):
            if value is not None:
                key = _jumble_case(draw, key.replace("-", draw(st.sampled_from(["-", "_"]))))
                pairs.append((key, format(value.normalize(), "f")))
        pairs = draw(st.permutations(pairs))
        return req, ",".join(f"{_ws(draw)}{k}{_ws(draw)}={_ws(draw)}{v}{_ws(draw)}" for k, v in pairs)
    items = []
    if req.models:
        items.append("|".join(f"{_ws(draw)}{_spell_model(draw, m)}{_ws(draw)}" for m in req.models))
    has_share = req.vram_gib is not None or req.cores_percent is not None
    if req.shared and not req.is_fractional and not has_share:
        items.append(_jumble_case(draw, "vgpu"))
    elif req.is_fractional and draw(st.booleans()):
        items.append("vgpu")
    if req.vram_gib is not None:
        items.append(_spell_size(draw, req.vram_gib))
    if req.cores_percent is not None:
        items.append(f"{req.cores_percent}{_ws(draw)}%")
    items = draw(st.permutations(items))
    count = _spell_count(draw, req.count)
    if not items and (not req.is_fractional or draw(st.booleans())):
        return req, f"{_ws(draw)}{count}{_ws(draw)}"
    inner = ",".join(f"{_ws(draw)}{item}{_ws(draw)}" for item in items) or "vgpu"
    return req, f"{_ws(draw)}{count}{_ws(draw)}({inner}){_ws(draw)}"


@given(requests())
@settings(max_examples=300)
def test_format_then_parse_gives_the_request_back(req):
    assert parse(format_gpu_spec(req)) == req


@given(spellings())
@settings(max_examples=500)
def test_every_spelling_parses_to_its_request_and_round_trips(case):
    req, text = case
    parsed = parse(text)
    assert parsed == req
    assert parse(format_gpu_spec(parsed)) == parsed


@given(
    st.lists(
        st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,8}( [A-Za-z0-9]{1,3})?", fullmatch=True).filter(
            lambda s: s.lower() != "vgpu"
        ),
        min_size=1,
        max_size=4,
    ),
    whole_counts,
)
def test_without_a_catalog_any_model_names_round_trip(names, count):
    req = parse_gpu_spec(f"{count}({'|'.join(names)})")
    assert req.models == tuple(sorted(set(names)))
    assert parse_gpu_spec(format_gpu_spec(req)) == req


@given(st.text(alphabet="0123456789.()|,%=-_ GgiMBvpuVATHtflopsram\t", max_size=30) | st.text(max_size=20))
@settings(max_examples=500)
def test_any_text_parses_or_raises_gpu_spec_error_and_what_parses_round_trips(text):
    for catalog in (CATALOG, None):
        try:
            req = parse_gpu_spec(text, catalog)
        except GPUSpecError:
            continue
        assert parse_gpu_spec(format_gpu_spec(req), catalog) == req
