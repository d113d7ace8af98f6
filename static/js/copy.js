// "Copy" buttons: <button data-copy="ID"> copies the value of the input #ID and selects it.
// Served from our own static files, so the Content-Security-Policy lets it run (an inline
// onfocus/onclick handler is refused).
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const field = document.getElementById(button.dataset.copy);
  if (!field) return;
  field.focus();
  field.select();
  const done = () => { button.textContent = "Copied"; };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(field.value).then(done, () => {
      button.textContent = "Selected: press Ctrl+C";
    });
  } else {
    button.textContent = document.execCommand("copy") ? "Copied" : "Selected: press Ctrl+C";
  }
});
