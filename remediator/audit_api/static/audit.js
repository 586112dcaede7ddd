// The login page: keep the bearer token in a same-site cookie for this site, then open the audit.
"use strict";
(function () {
  var form = document.getElementById("login");
  if (!form) { return; }
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var token = document.getElementById("token").value.trim();
    if (!token) { return; }
    var secure = window.location.protocol === "https:" ? "; Secure" : "";
    document.cookie = "remediator_audit_token=" + encodeURIComponent(token) +
      "; Path=/; SameSite=Strict" + secure;
    var next = form.getAttribute("data-next") || "/audit/";
    window.location.assign(next.indexOf("/audit") === 0 ? next : "/audit/");
  });
}());
