"""A replay page for `mythic sim --view`: the run, drawn in a browser from one HTML file.

The recorder samples the crowd between frames (never inside one) at `hz`: positions in
decimetres as int16, tiers as int8, and the player's position. `write` embeds them, base64,
in a self-contained page (no scripts or fonts fetched from anywhere) that plays the run on a
canvas: NPCs coloured by archetype, gold NPCs ringed, silver ones dimly ringed, the player in
white, with play/pause, speed and a time slider.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

_COLOURS = {
    "villager": "#c8b68e",
    "merchant": "#e0a040",
    "barkeep": "#f0d070",
    "guard": "#7090d0",
    "vampire": "#c02040",
    "werewolf": "#9a6a3a",
    "ghoul": "#70a070",
    "lich": "#a070e0",
    "zombie": "#5f8f3f",
    "human": "#c8b68e",
}


class ReplayRecorder:
    """Samples a controller's crowd for a replay page.

    Args:
        controller: the `mythic.control.Controller` being run.
        hz: samples per second of run time.
        max_bytes: stop sampling (and say so on the page) past this much data.
    """

    def __init__(self, controller: Any, *, hz: float = 10.0, max_bytes: int = 24_000_000) -> None:
        if not hz > 0:
            raise ValueError("hz must be positive")
        self._controller = controller
        self._period = 1.0 / hz
        self._max_bytes = max_bytes
        self._next = 0.0
        self._times: list[float] = []
        self._counts: list[int] = []
        self._players: list[tuple[float, float]] = []
        self._pos: list[bytes] = []
        self._tiers: list[bytes] = []
        self._archetypes: list[bytes] = []
        self._bytes = 0
        self.truncated = False
        """True when sampling stopped at `max_bytes`."""

    @property
    def samples(self) -> int:
        return len(self._times)

    def sample(self, t: float, player: tuple[float, float]) -> None:
        """Record the crowd at run time `t` (seconds) if a sample is due. Call between frames."""
        import numpy as np

        if t < self._next or self.truncated:
            return
        self._next = t + self._period
        crowd = self._controller.crowd
        n = len(crowd)
        pos = np.clip(np.rint(crowd.pos[:n] * 10.0), -32767, 32767).astype("<i2")
        size = pos.nbytes + 2 * n
        if self._bytes + size > self._max_bytes:
            self.truncated = True
            return
        self._bytes += size
        self._times.append(round(t, 3))
        self._counts.append(n)
        self._players.append((round(player[0], 2), round(player[1], 2)))
        self._pos.append(pos.tobytes())
        self._tiers.append(crowd.tier[:n].astype(np.int8).tobytes())
        self._archetypes.append(crowd.archetype[:n].astype(np.int8).tobytes())

    def write(self, path: Path, *, title: str = "mythic sim") -> None:
        """Write the page to `path` (its folder must exist)."""
        names = list(self._controller.crowd.archetypes.names)
        data = {
            "title": title,
            "times": self._times,
            "counts": self._counts,
            "players": self._players,
            "names": names,
            "colours": [_COLOURS.get(name, "#b0b0b0") for name in names],
            "pos": base64.b64encode(b"".join(self._pos)).decode("ascii"),
            "tiers": base64.b64encode(b"".join(self._tiers)).decode("ascii"),
            "archetypes": base64.b64encode(b"".join(self._archetypes)).decode("ascii"),
            "truncated": self.truncated,
        }
        blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        page = _PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", blob)
        path.write_text(page, encoding="utf-8")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{margin:0;background:#111;color:#ddd;font:13px system-ui,sans-serif}
#bar{padding:6px 10px;display:flex;gap:10px;align-items:center;flex-wrap:wrap}
#t{flex:1;min-width:200px}canvas{display:block;margin:0 auto;background:#1b1d1a}
.key{display:inline-flex;align-items:center;gap:4px}.dot{width:9px;height:9px;border-radius:50%}
</style></head><body>
<div id="bar"><button id="play">pause</button>
<label>speed <select id="speed"><option>0.5</option><option selected>1</option>
<option>2</option><option>4</option></select></label>
<input id="t" type="range" min="0" max="0" value="0"><span id="clock"></span>
<span id="legend"></span></div>
<canvas id="view" width="900" height="900"></canvas>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const raw = s => Uint8Array.from(atob(s), c => c.charCodeAt(0)).buffer;
const pos = new Int16Array(raw(D.pos)), tiers = new Int8Array(raw(D.tiers));
const arch = new Int8Array(raw(D.archetypes));
const starts = []; let acc = 0;
for (const n of D.counts) { starts.push(acc); acc += n; }
let lo = Infinity, hi = -Infinity;
for (let i = 0; i < pos.length; i++) { lo = Math.min(lo, pos[i]); hi = Math.max(hi, pos[i]); }
if (!isFinite(lo)) { lo = 0; hi = 10; }
const pad = (hi - lo) * 0.03 + 10;
const canvas = document.getElementById("view"), g = canvas.getContext("2d");
const slider = document.getElementById("t"), clock = document.getElementById("clock");
slider.max = Math.max(0, D.times.length - 1);
document.getElementById("legend").innerHTML = D.names.map((n, i) =>
  `<span class="key"><span class="dot" style="background:${D.colours[i]}"></span>${n}</span>`
).join(" ") + ' <span class="key">ring: gold / silver tier</span>' +
  (D.truncated ? " <b>(recording truncated)</b>" : "");
function fit() {
  const size = Math.min(innerWidth, innerHeight - 50);
  canvas.width = canvas.height = Math.max(200, size);
}
addEventListener("resize", () => { fit(); draw(); }); fit();
const sx = v => (v - lo + pad) / (hi - lo + 2 * pad) * canvas.width;
const sy = v => canvas.height - (v - lo + pad) / (hi - lo + 2 * pad) * canvas.height;
function draw() {
  const k = +slider.value, n = D.counts[k] || 0, s = starts[k] || 0;
  g.clearRect(0, 0, canvas.width, canvas.height);
  const r = Math.max(1.2, canvas.width / 450);
  for (let i = 0; i < n; i++) {
    const x = sx(pos[2 * (s + i)]), y = sy(pos[2 * (s + i) + 1]);
    g.fillStyle = D.colours[arch[s + i]] || "#999";
    g.fillRect(x - r, y - r, 2 * r, 2 * r);
    const tier = tiers[s + i];
    if (tier < 2) {
      g.strokeStyle = tier === 0 ? "#ffd700" : "rgba(192,192,192,0.45)";
      g.beginPath(); g.arc(x, y, r * 2.6, 0, 7); g.stroke();
    }
  }
  if (D.players[k]) {
    const [px, py] = D.players[k];
    g.fillStyle = "#fff"; g.beginPath(); g.arc(sx(px * 10), sy(py * 10), r * 3, 0, 7); g.fill();
  }
  clock.textContent = `${(D.times[k] || 0).toFixed(1)} s, ${n} NPCs`;
}
let playing = true, last = performance.now(), at = 0;
document.getElementById("play").onclick = e => {
  playing = !playing; e.target.textContent = playing ? "pause" : "play";
};
slider.oninput = () => { at = D.times[+slider.value] || 0; draw(); };
function tick(now) {
  if (playing && D.times.length) {
    at += (now - last) / 1000 * +document.getElementById("speed").value;
    if (at > D.times[D.times.length - 1]) at = D.times[0];
    let k = +slider.value;
    while (k + 1 < D.times.length && D.times[k + 1] <= at) k++;
    if (D.times[k] > at) k = 0;
    slider.value = k; draw();
  }
  last = now; requestAnimationFrame(tick);
}
draw(); requestAnimationFrame(tick);
</script></body></html>
"""
