/* The test request box of an inference service: the portal sends one request to the service's port and answers
   its status, time and body as JSON; the body is shown as text. (The service's own origin is another site: this
   page never calls it.) */
(function () {
  "use strict";
  document.querySelectorAll("form[data-test-request]").forEach(function (form) {
    var out = form.querySelector("[data-test-response]");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var method = form.elements.method.value;
      var path = "/" + form.elements.path.value.replace(/^\/+/, "");
      out.hidden = false;
      out.textContent = method + " " + path + " …";
      fetch(form.dataset.testRequest, {method: "POST", credentials: "same-origin", body: new FormData(form)})
        .then(function (response) {
          return response.json().then(function (answer) {
            if (!response.ok) {
              out.dataset.status = "";
              out.textContent = "Not sent: " + answer.detail;
              return;
            }
            out.dataset.status = answer.status;
            out.textContent = answer.status + " " + answer.reason + " (" + answer.elapsed_ms + " ms)\n\n" + answer.body;
          });
        })
        .catch(function (error) { out.textContent = "No answer: " + error; });
    });
  });
})();
