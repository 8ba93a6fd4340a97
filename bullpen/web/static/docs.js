// Swagger UI over this server's OpenAPI document, from the vendored bundle (no CDN: the
// Content-Security-Policy allows scripts and styles from this origin only).
window.addEventListener("DOMContentLoaded", () => {
  window.SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
  });
});
