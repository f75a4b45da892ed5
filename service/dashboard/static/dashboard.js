// kiln admin: ask before destructive actions. Without JavaScript the server asks instead
// (a form posted without `confirmed` renders a confirmation page).
"use strict";
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.dataset ? form.dataset.confirm : undefined;
  if (!question) return;
  if (!window.confirm(question)) {
    event.preventDefault();
    return;
  }
  if (!form.querySelector('input[name="confirmed"]')) {
    const field = document.createElement("input");
    field.type = "hidden";
    field.name = "confirmed";
    field.value = "yes";
    form.appendChild(field);
  }
});
