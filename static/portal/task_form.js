// The task form: queue rules and GPU rows follow the chosen VDC and queue; a GPU row fills the spec;
// the hourly price is estimated as the fields change. A static file, as the Content Security Policy
// allows no inline scripts.
(function () {
  var queue = document.getElementById("id_queue");
  var vdc = document.getElementById("id_vdc");
  var gpu = document.getElementById("id_gpu_spec");
  var duration = document.querySelector('[data-field-name="expected_duration"]');
  function sync() {
    var selected = queue && queue.value;
    var vdcId = vdc && vdc.value;
    document.querySelectorAll(".queue-rules li").forEach(function (li) {
      li.classList.toggle("selected", li.dataset.queueId === selected);
      li.hidden = vdcId && li.dataset.vdc !== vdcId;
      if (li.dataset.queueId === selected && duration) {
        duration.classList.toggle("required", li.dataset.queueClass === "medium");
      }
    });
    document.querySelectorAll(".gpu-picker tbody tr[data-vdc]").forEach(function (tr) {
      tr.hidden = vdcId && tr.dataset.vdc !== vdcId;
    });
    if (queue && vdcId) {
      Array.prototype.forEach.call(queue.options, function (opt) {
        var li = document.querySelector('.queue-rules li[data-queue-id="' + opt.value + '"]');
        if (li) { opt.hidden = li.dataset.vdc !== vdcId; }
      });
    }
  }
  if (queue) { queue.addEventListener("change", sync); }
  if (vdc) { vdc.addEventListener("change", sync); }
  document.querySelectorAll("[data-gpu-pick]").forEach(function (button) {
    button.addEventListener("click", function () {
      gpu.value = "1(" + button.dataset.gpuPick + ")";
      // Set from a script, the field fires no event by itself: the price would stay the old request's.
      gpu.dispatchEvent(new Event("input", {bubbles: true}));
      gpu.focus();
    });
  });
  var price = document.querySelector("[data-price-url]");
  var priceTimer = null;
  function estimate() {
    clearTimeout(priceTimer);
    priceTimer = setTimeout(function () {
      var params = new URLSearchParams();
      ["vdc", "cpu", "memory_gib", "gpu_spec", "instances"].forEach(function (name) {
        var input = document.getElementById("id_" + name);
        if (input) { params.set(name, input.value); }
      });
      fetch(price.dataset.priceUrl + "?" + params.toString(), {credentials: "same-origin"})
        .then(function (r) { return r.json(); })
        .then(function (data) {
          price.querySelector("[data-price]").textContent = data.display === null ? "—" : data.display;
          var minimum = data.minimum_minutes > 1 ? "; each run is billed at least " + data.minimum_minutes + " min" : "";
          price.querySelector("[data-price-note]").textContent = data.error || (data.hourly_price === null ? "no price applies" : "list price, before discounts" + minimum);
        }).catch(function () {});
    }, 250);
  }
  ["id_vdc", "id_cpu", "id_memory_gib", "id_gpu_spec", "id_instances"].forEach(function (id) {
    var input = document.getElementById(id);
    if (input) { input.addEventListener("input", estimate); input.addEventListener("change", estimate); }
  });
  if (price) { estimate(); }
  sync();
  // A refused submission comes back at the top of a long form: the summary says what to fix, and the first
  // field in error takes the focus (scrolled into view) so the user does not hunt for it.
  var summary = document.querySelector("[data-error-summary]");
  if (summary) {
    var first = summary.querySelector("[data-error-link]");
    var target = first && document.getElementById(first.dataset.errorLink);
    if (target) {
      target.focus();
      target.scrollIntoView({block: "center"});
    } else {
      summary.focus();
    }
    summary.querySelectorAll("[data-error-link]").forEach(function (link) {
      link.addEventListener("click", function (event) {
        var field = document.getElementById(link.dataset.errorLink);
        if (field) { event.preventDefault(); field.focus(); field.scrollIntoView({block: "center"}); }
      });
    });
  }
})();
