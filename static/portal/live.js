/* Live updates over the one socket (ws/live/): subscribe to what the page shows, redraw on pushes,
   reconnect with backoff after a drop. The monitoring page also polls the log tail every 2 s and its
   instance table every 3 s. */
(function () {
  "use strict";
  // Destructive actions (stop, delete) ask first: a form with data-confirm submits only once confirmed.
  // A bulk form names its selection (data-confirm-count, a selector): "{n}" in the question is its size.
  document.addEventListener("submit", function (event) {
    var data = event.target.dataset || {};
    var question = data.confirm;
    if (question && data.confirmCount) {
      var n = document.querySelectorAll(data.confirmCount).length;
      if (!n) { window.alert(data.confirmNone || "Nothing selected."); event.preventDefault(); return; }
      question = question.replace("{n}", n);
    }
    if (question && !window.confirm(question)) { event.preventDefault(); }
  }, true);
  // "Select all on this page" ticks every visible box of its form.
  document.addEventListener("change", function (event) {
    var form = event.target.dataset && event.target.dataset.selectAll;
    if (!form) { return; }
    document.querySelectorAll("input[form=" + form + "][name=task]").forEach(function (box) {
      if (!box.hidden) { box.checked = event.target.checked; }
    });
  });
  var body = document.body;
  var url = body.dataset.liveUrl;
  var statusDot = document.querySelector("[data-live-status]");
  var retry = 0;
  var socket = null;
  var refreshTimer = null;

  function subscriptions() {
    var subs = [];
    var seen = {};
    function add(kind, id) {
      var key = kind + ":" + id;
      if (!seen[key] && id) { seen[key] = true; subs.push({subscribe: kind, id: parseInt(id, 10)}); }
    }
    document.querySelectorAll("[data-live-task]").forEach(function (el) { add("task", el.dataset.liveTask); });
    document.querySelectorAll("[data-live-queue]").forEach(function (el) { add("queue", el.dataset.liveQueue); });
    // Lists follow their projects, so a task submitted elsewhere shows up (the server filters the rows).
    document.querySelectorAll("[data-live-projects]").forEach(function (el) {
      el.dataset.liveProjects.split(" ").forEach(function (id) { add("project", id); });
    });
    add("user", body.dataset.userId);
    return subs;
  }

  function setText(root, field, text) {
    root.querySelectorAll('[data-field="' + field + '"]').forEach(function (el) { el.textContent = text; });
  }

  function applyTask(msg) {
    var rows = document.querySelectorAll('[data-live-task="' + msg.id + '"]');
    // A task this list does not show yet: fetch the list again; its filters, sort and rights decide.
    if (!rows.length && document.querySelector("[data-live-list]")) { scheduleRefresh(1000); }
    rows.forEach(function (root) {
      var badge = root.querySelector('[data-field="status"]');
      var changed = badge && badge.dataset.status !== msg.status;
      if (badge) {
        badge.textContent = msg.status_display;
        badge.className = badge.className.replace(/status-\S+/, "status-" + msg.status);
        badge.dataset.status = msg.status;
      }
      setText(root, "summary", msg.summary);
      setText(root, "status_message", msg.status_message || "");
      var location = [msg.cluster, (msg.nodes || []).join(", ")].filter(Boolean).join(" / ");
      root.querySelectorAll('[data-field="location"]').forEach(function (el) {
        var vdc = el.textContent.split(" / ")[0];
        el.textContent = location ? vdc + " / " + location : vdc;
      });
      var pending = root.querySelector('[data-field="pending"]');
      if (pending) {
        var why = msg.pending_message || msg.pending_reason || "";
        pending.hidden = !why;
        setText(pending, "pending_text", why);
      }
      root.querySelectorAll("[data-show-when]").forEach(function (el) {
        el.hidden = el.dataset.showWhen === "final" ? !msg.is_final : msg.is_final;
      });
      if (changed && root.dataset.livePage === "monitoring") { scheduleRefresh(); }
    });
  }

  function applyQueue(msg) {
    document.querySelectorAll('[data-live-queue="' + msg.id + '"]').forEach(function (root) {
      setText(root, "waiting", msg.waiting);
      setText(root, "running", msg.running);
      setText(root, "gpu_in_use", msg.gpu_in_use);
    });
    // Who is ahead of whom is drawn by the server, which knows what this user may see of each task.
    if (document.querySelector('[data-lineup="' + msg.id + '"]')) { scheduleRefresh(1000); }
  }

  // Pages redraw their marked sections (the monitoring page's timeline and usage, a list's rows, a queue's
  // line) from a fresh copy of themselves, at most once per delay however many pushes arrive meanwhile.
  function scheduleRefresh(delay) {
    if (refreshTimer) { return; }
    refreshTimer = setTimeout(function () {
      refreshTimer = null;
      fetch(window.location.pathname + window.location.search, {credentials: "same-origin"})
        .then(function (r) { return r.text(); })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html");
          var ticked = [];
          document.querySelectorAll("input[name=task]:checked").forEach(function (box) { ticked.push(box.value); });
          document.querySelectorAll("[data-live-refresh]").forEach(function (el) {
            var other = fresh.querySelector('[data-live-refresh="' + el.dataset.liveRefresh + '"]');
            if (other) { el.innerHTML = other.innerHTML; }
          });
          ticked.forEach(function (id) {
            var box = document.querySelector('input[name=task][value="' + id + '"]');
            if (box) { box.checked = true; }
          });
        }).catch(function () {});
    }, delay || 300);
  }

  function setStatus(state) { if (statusDot) { statusDot.dataset.liveStatus = state; } }

  // A project alert (quota, budget, idle cards, failures, a service): a notice on any page, and the dashboard's
  // list gains or loses it. Text goes in as text, never as markup.
  function applyAlert(msg) {
    var list = document.querySelector("[data-alert-list]");
    if (list) {
      var old = list.querySelector('[data-alert="' + msg.id + '"]');
      if (old) { old.remove(); }
      if (!msg.resolved) {
        var item = document.createElement("li");
        item.className = "alert alert-" + msg.severity;
        item.dataset.alert = msg.id;
        var title = document.createElement("strong");
        title.textContent = msg.title;
        var text = document.createElement("div");
        text.textContent = msg.message;
        var action = document.createElement("div");
        action.className = "small muted";
        action.textContent = msg.action || "";
        item.append(title, text, action);
        list.prepend(item);
      }
      list.closest("[data-alerts]").hidden = !list.children.length;
    }
    var box = document.querySelector("[data-toasts]");
    if (!box) {
      box = document.createElement("div");
      box.className = "toasts";
      box.dataset.toasts = "";
      box.setAttribute("role", "status");
      document.body.append(box);
    }
    var toast = document.createElement("div");
    toast.className = "toast alert-" + (msg.resolved ? "resolved" : msg.severity);
    toast.dataset.toast = msg.id;
    toast.textContent = (msg.resolved ? "Resolved: " : "") + msg.title + ": " + msg.message;
    box.append(toast);
    setTimeout(function () { toast.remove(); }, 15000);
  }

  function connect() {
    if (!url || !window.WebSocket) { return; }
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + window.location.host + url);
    setStatus("connecting");
    socket.onopen = function () {
      retry = 0;
      setStatus("open");
      subscriptions().forEach(function (s) { socket.send(JSON.stringify(s)); });
    };
    socket.onmessage = function (event) {
      var msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      if (msg.type === "task") { applyTask(msg); }
      else if (msg.type === "queue") { applyQueue(msg); }
      else if (msg.type === "alert") { applyAlert(msg); }
    };
    socket.onclose = function (event) {
      setStatus("closed");
      if (event.code === 4401) { return; }  // signed out: reconnecting cannot help
      var delay = Math.min(30000, 1000 * Math.pow(2, retry)) * (0.75 + Math.random() / 2);
      retry += 1;
      setTimeout(connect, delay);
    };
  }

  // Follows the log through the API's cursor: each read returns only what the run wrote since the last one,
  // appended; when the run ends the cursor is dropped, so the next read shows the latest run's tail again.
  function followLog(pre, note) {
    var cursor = null;
    var MAX_CHARS = 2000000;
    function schedule(ms) { setTimeout(tick, ms); }
    function tick() {
      if (document.hidden) { schedule(2000); return; }
      var url = pre.dataset.logFollowUrl + (cursor ? "?after=" + encodeURIComponent(cursor) : "?tail=200");
      // An earlier run's log (?run=N on the page) is read whole and does not change any more.
      if (pre.dataset.logAttempt && !cursor) { url += "&attempt=" + encodeURIComponent(pre.dataset.logAttempt); }
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.json(); })
        .then(function (data) {
          var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
          if (cursor) { pre.textContent += data.text; } else { pre.textContent = data.text; }
          if (pre.textContent.length > MAX_CHARS) { pre.textContent = pre.textContent.slice(-MAX_CHARS / 2); }
          if (note) { note.textContent = pre.textContent ? "" : data.note; }
          if (atBottom) { pre.scrollTop = pre.scrollHeight; }
          cursor = data.running || data.more ? data.cursor : null;
          schedule(data.more ? 0 : data.running ? 1000 : 5000);
        }).catch(function () { schedule(5000); });
    }
    tick();
  }

  function pollLog() {
    var pre = document.querySelector("[data-log-url]");
    if (!pre) { return; }
    var note = document.querySelector("[data-log-note]");
    if (pre.dataset.logFollowUrl) { followLog(pre, note); return; }
    function tick() {
      if (document.hidden) { return; }
      fetch(pre.dataset.logUrl, {credentials: "same-origin"}).then(function (r) { return r.json(); })
        .then(function (data) {
          var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
          pre.textContent = data.text || "";
          if (note) { note.textContent = data.note || ""; }
          if (atBottom) { pre.scrollTop = pre.scrollHeight; }
        }).catch(function () {});
    }
    tick();
    setInterval(tick, 2000);
  }

  // The monitoring page's instance table (state, CPU, memory, cards of each instance) is redrawn from the
  // server every few seconds while the task runs; the figures come from its backend and the node agent.
  function pollInstances() {
    var box = document.querySelector("[data-instances-url]");
    if (!box) { return; }
    var busy = false;
    setInterval(function () {
      if (document.hidden || busy) { return; }
      busy = true;
      fetch(box.dataset.instancesUrl, {credentials: "same-origin"})
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
        .then(function (html) { box.innerHTML = html; box.dataset.refreshedAt = Date.now(); })
        .catch(function () {})
        .then(function () { busy = false; });
    }, 3000);
  }

  connect();
  pollLog();
  pollInstances();
})();
