/* The test request box of an inference service: one request through the portal's proxy (Connect), with the
   user's session, and the service's answer shown as it came. */
(function () {
  "use strict";
  document.querySelectorAll("form[data-test-request]").forEach(function (form) {
    var out = form.querySelector("[data-test-response]");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var method = form.elements.method.value;
      var url = form.dataset.testRequest + form.elements.path.value.replace(/^\/+/, "");
      var options = {method: method, credentials: "same-origin", headers: {}};
      if (method !== "GET") {
        options.body = form.elements.body.value;
        options.headers["Content-Type"] = "application/json";
      }
      out.hidden = false;
      out.textContent = method + " " + url + " …";
      var began = performance.now();
      fetch(url, options).then(function (response) {
        return response.text().then(function (text) {
          var ms = Math.round(performance.now() - began);
          out.dataset.status = response.status;
          out.textContent = response.status + " " + response.statusText + " (" + ms + " ms)\n\n" + text;
        });
      }).catch(function (error) { out.textContent = "No answer: " + error; });
    });
  });
})();
