// The alignment heat-map, drawn by fairseq-plugins-serve's page and by the page of an ONNX folder.
"use strict";

document.head.insertAdjacentHTML("beforeend", `<style>
  table.heatmap { border-collapse: collapse; margin-top: 1em; }
  .heatmap td { width: 2.2em; height: 2.2em; border: 1px solid #eee; }
  .heatmap th { font-weight: normal; padding: 0 .4em; white-space: nowrap; }
  .heatmap thead th { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; padding: .4em 0; }
  .heatmap tbody th { text-align: right; }
</style>`);

function heatmap(source, target, weights) {
  // One row per target token, one column per source token; darker = more attention.
  const table = document.createElement("table");
  table.className = "heatmap";
  table.id = "heatmap";
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  for (const token of source) {
    const th = document.createElement("th");
    th.textContent = token;
    head.appendChild(th);
  }
  const body = table.createTBody();
  target.forEach((token, i) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.textContent = token;
    row.appendChild(th);
    weights[i].forEach((w, j) => {
      const cell = row.insertCell();
      const shade = Math.round(255 * (1 - w));
      cell.style.background = `rgb(${shade}, ${shade}, 255)`;
      cell.title = `${token} / ${source[j]}: ${w.toFixed(3)}`;
      cell.dataset.weight = String(w);  // the value itself, for whoever reads the table
    });
  });
  return table;
}
