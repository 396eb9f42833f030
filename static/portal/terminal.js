/* The Web Console: xterm.js on the terminal socket (ws/tasks/<id>/terminal/). Keystrokes and size changes go
   up as JSON, the shell's output comes down as binary frames; a refusal or the end comes as JSON, then a close. */
(function () {
  "use strict";
  var el = document.getElementById("terminal");
  if (!el || !window.Terminal) { return; }
  var status = document.querySelector("[data-terminal-status]");

  function say(text, state) {
    status.textContent = text;
    status.dataset.state = state;
  }

  // At a line height of 1.0 a row is exactly the font's ascent + descent, and the underscore drawn below the
  // baseline is clipped at a device pixel ratio of 1 (snake_case_name read "snake case name").
  var term = new window.Terminal({cursorBlink: true, fontSize: 14, lineHeight: 1.2, scrollback: 5000,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"});
  var fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();

  var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
  var url = scheme + window.location.host + el.dataset.socket + "&rows=" + term.rows + "&cols=" + term.cols;
  var socket = new WebSocket(url);
  socket.binaryType = "arraybuffer";
  var ended = "";

  function send(message) {
    if (socket.readyState === WebSocket.OPEN) { socket.send(JSON.stringify(message)); }
  }

  socket.onopen = function () { say("Connected.", "open"); term.focus(); };
  socket.onmessage = function (event) {
    if (typeof event.data !== "string") {
      term.write(new Uint8Array(event.data));
      return;
    }
    var message = JSON.parse(event.data);
    if (message.type === "refused" || message.type === "exit" || message.type === "revoked") { ended = message.message; }
  };
  socket.onclose = function (event) {
    var why = ended || event.reason || "The connection was lost.";
    say("Closed: " + why + (event.code && event.code !== 1000 ? " (" + event.code + ")" : ""), "closed");
    term.options.disableStdin = true;
  };
  term.onData(function (data) { send({input: data}); });
  term.onResize(function (size) { send({resize: [size.rows, size.cols]}); });
  window.addEventListener("resize", function () { fit.fit(); });
})();
