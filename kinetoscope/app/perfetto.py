"""Open the current rank's trace in the Perfetto UI, the way Perfetto documents for tools that link to it:
open ui.perfetto.dev in a new tab, send 'PING' until it answers 'PONG', then post the trace as an ArrayBuffer
(``{perfetto: {buffer, title, fileName}}``). The trace goes from this browser tab to the Perfetto tab directly,
never through a server; it is redacted first (secrets in metadata and event arguments) and gzipped (Perfetto
reads gzipped JSON). ``KINETOSCOPE_PERFETTO_URL`` points at a self-hosted Perfetto UI (an offline cluster)."""

from __future__ import annotations

import base64
import gzip
import html
import json
import os


from kinetoscope.analyze.loader import read_bytes
from kinetoscope.analyze.redact import redacted_trace
from kinetoscope.app import state
from kinetoscope.app.data import Analysis, app_limits, content_key, job_file
from kinetoscope.app.ui import components_html, plain, st
from kinetoscope.errors import KinetoscopeError

URL_ENV = "KINETOSCOPE_PERFETTO_URL"
DEFAULT_URL = "https://ui.perfetto.dev"
#: a larger trace makes the page itself heavy (it travels to the browser once): download it instead
MAX_GZ_BYTES = 64 << 20
_PREPARED = "perfetto_prepared"


def perfetto_url() -> str:
    return os.environ.get(URL_ENV, DEFAULT_URL).rstrip("/")


def open_in_perfetto(analysis: Analysis, rank: int) -> None:
    """A button that prepares the rank's trace, then a link-like button that opens it in Perfetto. What was
    prepared is kept for the session under the file's identity (path, size, modification time): another file of
    the same name (a new upload, a file rewritten on disk) is prepared afresh."""
    files = dict(analysis.rank_files)
    name = files.get(rank)
    if name is None:
        return
    path = job_file(st.session_state.get(state.JOB), name)
    key = (name, content_key((path,)) if path is not None else None)
    got = (st.session_state.get(_PREPARED) or {}).get(key)
    if got is None:
        if not st.button(f"Open {name} in Perfetto", key=f"perfetto_prepare_{rank}",
                         help="the full trace, every event, in the Perfetto UI (redacted first)"):
            return
        got = _prepare(analysis, rank, name)
        st.session_state[_PREPARED] = {key: got}  # one prepared trace at a time: it can be large
    if isinstance(got, str):
        st.warning(got)
        return
    file_name, data = got
    _launcher(plain(file_name), data)  # the name as the page shows it: a secret in it redacted


def _prepare(analysis: Analysis, rank: int, name: str) -> tuple[str, bytes] | str:
    path = job_file(st.session_state.get(state.JOB), name)
    if path is None:
        return f"{name} is no longer on the server (the upload was removed when its session ended): upload it again."
    try:
        data = gzip.compress(redacted_trace(read_bytes(path, app_limits())), compresslevel=1)
    except KinetoscopeError as exc:
        return f"{name}: {getattr(exc, 'reason', exc)}"
    if len(data) > MAX_GZ_BYTES:
        return (f"{name} is {len(data) / 2**20:,.0f} MiB gzipped, too large to hand over through the page: download "
                "it from Export and open it in Perfetto with 'Open trace file'.")
    base = name[:-3] if name.endswith(".gz") else name
    return base + ".gz", data


def _js(value: str) -> str:
    """A JavaScript string literal that cannot end the script element it sits in."""
    return json.dumps(value).replace("<", "\\u003c")


def _launcher(file_name: str, data: bytes) -> None:
    url = perfetto_url()
    payload = base64.b64encode(data).decode("ascii")
    # the click inside this frame is the user gesture that lets the browser open a tab
    components_html(f"""
<button id="open" style="font: 14px sans-serif; padding: 6px 12px; cursor: pointer">Open {html.escape(file_name)} in
Perfetto ↗</button> <span id="status" style="font: 13px sans-serif; color: #555"></span>
<script>
const URL_ = {_js(url)};
const ORIGIN = new URL(URL_).origin;
const B64 = "{payload}";
function bytes() {{
  const s = atob(B64); const b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  return b.buffer;
}}
document.getElementById("open").onclick = () => {{
  const status = document.getElementById("status");
  const win = window.open(URL_);
  if (!win) {{ status.textContent = "the browser blocked the new tab: allow pop-ups for this page"; return; }}
  status.textContent = "waiting for Perfetto…";
  const timer = setInterval(() => win.postMessage("PING", ORIGIN), 50);
  window.addEventListener("message", function onMessage(evt) {{
    if (evt.source !== win || evt.data !== "PONG") return;
    clearInterval(timer);
    window.removeEventListener("message", onMessage);
    win.postMessage({{perfetto: {{buffer: bytes(), title: {_js(file_name)}, fileName: {_js(file_name)}}}}}, ORIGIN);
    status.textContent = "sent to Perfetto ({len(data):,} bytes, gzipped)";
  }});
}};
</script>""", height=44)
