// Exchanges the ops token (or an admin key) for an HttpOnly session cookie, then loads the dashboard.
document.getElementById("signin").addEventListener("submit", async (event) => {
  event.preventDefault();
  const message = document.getElementById("message");
  message.textContent = "";
  const r = await fetch("/dashboard/session", {
    method: "POST", headers: { "content-type": "application/json" }, cache: "no-store",
    body: JSON.stringify({ token: document.getElementById("token").value }),
  });
  const body = await r.json().catch(() => ({}));  // read it whole: navigating away mid-body aborts the request
  if (r.ok) { window.location.replace("/dashboard"); return; }
  message.textContent = (body.error && body.error.message) || `sign-in failed (HTTP ${r.status})`;
});
