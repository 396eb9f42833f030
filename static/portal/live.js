/* Live updates over the one socket (ws/live/): subscribe to what the page shows, redraw on pushes,
   reconnect with backoff after a drop. The monitoring page also polls the log tail every 2 s. */
(function () {
  "use strict";
  // Destructive actions (stop, delete) ask first: a form with data-confirm submits only once confirmed.
  document.addEventListener("submit", function (event) {
    var question = event.target.dataset && event.target.dataset.confirm;
    if (question && !window.confirm(question)) { event.preventDefault(); }
  }, true);
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
    add("user", body.dataset.userId);
    return subs;
  }

  function setText(root, field, text) {
    root.querySelectorAll('[data-field="' + field + '"]').forEach(function (el) { el.textContent = text; });
  }

  function applyTask(msg) {
    document.querySelectorAll('[data-live-task="' + msg.id + '"]').forEach(function (root) {
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
  }

  // The monitoring page redraws its timeline and usage sections from a fresh copy of itself.
  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(function () {
      fetch(window.location.pathname, {credentials: "same-origin"}).then(function (r) { return r.text(); })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html");
          document.querySelectorAll("[data-live-refresh]").forEach(function (el) {
            var other = fresh.querySelector('[data-live-refresh="' + el.dataset.liveRefresh + '"]');
            if (other) { el.innerHTML = other.innerHTML; }
          });
        }).catch(function () {});
    }, 300);
  }

  function setStatus(state) { if (statusDot) { statusDot.dataset.liveStatus = state; } }

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

  connect();
  pollLog();
})();
