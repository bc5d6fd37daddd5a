"""A rank's trace, redacted and gzipped, for download and for the Perfetto UI.

The Perfetto hand-off follows what Perfetto documents for tools that link to it: open ui.perfetto.dev in a new
tab, send 'PING' until it answers 'PONG', then post the trace as an ArrayBuffer (``{perfetto: {buffer, title,
fileName}}``). The trace goes from this browser tab to the Perfetto tab directly, never through a server. Before
offering the button the page checks that the Perfetto UI can be reached from this browser: when it cannot
(offline, a cluster without internet), it says so at once and offers the file instead; so it does when Perfetto
never answers. ``KINETOSCOPE_PERFETTO_URL`` points at a self-hosted Perfetto UI.

The trace is prepared once per session and file (redacted: secrets in metadata and event arguments; gzipped as
it is redacted, never held as a second uncompressed copy), and the same bytes serve the download and Perfetto."""

from __future__ import annotations

import base64
import html
import json
import os

from kinetoscope.analyze.ingest.loader import read_bytes
from kinetoscope.analyze.ingest.redact import redacted_gzip
from kinetoscope.app import state
from kinetoscope.app.data import Analysis, app_limits, content_key, job_file
from kinetoscope.app.ui import components_html, download, md, plain, st
from kinetoscope.errors import KinetoscopeError

URL_ENV = "KINETOSCOPE_PERFETTO_URL"
DEFAULT_URL = "https://ui.perfetto.dev"
#: a larger trace makes the page itself heavy (it travels to the browser once): download it instead
MAX_GZ_BYTES = 64 << 20
#: how long the page waits for the Perfetto UI to answer (the reachability check, then PING/PONG), in ms
REACH_TIMEOUT_MS = 5000
ANSWER_TIMEOUT_MS = 20000
_PREPARED = "perfetto_prepared"


def perfetto_url() -> str:
    return os.environ.get(URL_ENV, DEFAULT_URL).rstrip("/")


def gz_name(name: str) -> str:
    """The name the redacted, gzipped copy of ``name`` goes by (a .gz stays .gz; a .json becomes .json.gz)."""
    return name if name.endswith(".gz") else name + ".gz"


def prepared(analysis: Analysis, rank: int, label: str, purpose: str) -> tuple[str, bytes] | str | None:
    """The rank's redacted .gz as (file name, bytes), or why not (one sentence), once the user pressed the button
    labelled ``label``; None before. Kept for the session under the file's identity (path, size, modification
    time): another file of the same name (a new upload, a file rewritten on disk) is prepared afresh."""
    name = dict(analysis.rank_files).get(rank)
    if name is None:
        return None
    path = job_file(st.session_state.get(state.JOB), name)
    key = (name, content_key((path,)) if path is not None else None)
    got = (st.session_state.get(_PREPARED) or {}).get(key)
    if got is not None:
        return got
    if not st.button(label, key=f"{purpose}_prepare_{rank}",
                     help="the full trace, every event, with secrets redacted, gzipped"):
        return None
    if path is None:
        got = f"{name} is no longer on the server (the upload was removed when its session ended): upload it again."
    else:
        try:
            with st.spinner(md("Redacting and compressing {}…", name)):
                got = (gz_name(name), redacted_gzip(read_bytes(path, app_limits())))
        except KinetoscopeError as exc:
            got = f"{name}: {getattr(exc, 'reason', exc)}"
    st.session_state[_PREPARED] = {key: got}  # one prepared trace at a time: it can be large
    st.rerun()  # every place that offers this file now shows it (a section above this one was drawn without it)


def open_in_perfetto(analysis: Analysis, rank: int) -> None:
    """A button that prepares the rank's trace, then the hand-off to Perfetto (or, where Perfetto cannot be
    reached, the file)."""
    name = dict(analysis.rank_files).get(rank)
    if name is None:
        return
    got = prepared(analysis, rank, f"Prepare {name} for Perfetto", "perfetto")
    if got is None:
        return
    if isinstance(got, str):
        st.warning(got)
        return
    file_name, data = got
    if len(data) > MAX_GZ_BYTES:
        st.info(md("{} is {:,.0f} MiB gzipped, too large to hand over through the page: download it below and open it "
                   "in Perfetto with Open trace file.", file_name, len(data) / 2**20))
        st.download_button(f"Download {file_name}", download(data), file_name=file_name, mime="application/gzip",
                           key=f"perfetto_download_{rank}")
        return
    _launcher(plain(file_name), data)  # the name as the page shows it: a secret in it redacted


def _js(value: str) -> str:
    """A JavaScript string literal that cannot end the script element it sits in."""
    return json.dumps(value).replace("<", "\\u003c")


def _launcher(file_name: str, data: bytes) -> None:
    url = perfetto_url()
    payload = base64.b64encode(data).decode("ascii")
    # the click inside this frame is the user gesture that lets the browser open a tab
    components_html(f"""
<div style="font: 14px sans-serif; color: #31333f">
<button id="open" disabled style="font: 14px sans-serif; padding: 6px 12px; cursor: pointer">Open in Perfetto
↗</button>
<a id="save" style="display: none; margin-left: 8px">Save {html.escape(file_name)} to open it
elsewhere</a>
<div id="status" style="font: 13px sans-serif; color: #31333f; margin-top: 4px">Checking that the Perfetto UI
({html.escape(url)}) can be reached…</div>
</div>
<script>
const URL_ = {_js(url)};
const ORIGIN = new URL(URL_).origin;
const NAME = {_js(file_name)};
const B64 = "{payload}";
const status = document.getElementById("status");
const open = document.getElementById("open");
const save = document.getElementById("save");
function bytes() {{
  const s = atob(B64); const b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  return b.buffer;
}}
function offerFile(why) {{
  status.textContent = why;
  save.href = URL.createObjectURL(new Blob([bytes()], {{type: "application/gzip"}}));
  save.download = NAME;
  save.style.display = "inline";
}}
const reach = new AbortController();
const reachTimer = setTimeout(() => reach.abort(), {REACH_TIMEOUT_MS});
fetch(URL_, {{mode: "no-cors", cache: "no-store", signal: reach.signal}}).then(() => {{
  clearTimeout(reachTimer);
  open.disabled = false;
  status.textContent = "";
}}).catch(() => {{
  clearTimeout(reachTimer);
  offerFile("The Perfetto UI at " + URL_ + " cannot be reached from this browser (offline, or blocked): save the "
            + "trace and open it in a Perfetto UI you can reach, with Open trace file.");
}});
open.onclick = () => {{
  const win = window.open(URL_);
  if (!win) {{ status.textContent = "The browser blocked the new tab: allow pop-ups for this page."; return; }}
  status.textContent = "Waiting for Perfetto…";
  const ping = setInterval(() => win.postMessage("PING", ORIGIN), 50);
  const giveUp = setTimeout(() => {{
    clearInterval(ping);
    offerFile("Perfetto did not answer: save the trace and open it there with Open trace file.");
  }}, {ANSWER_TIMEOUT_MS});
  window.addEventListener("message", function onMessage(evt) {{
    if (evt.source !== win || evt.data !== "PONG") return;
    clearInterval(ping);
    clearTimeout(giveUp);
    window.removeEventListener("message", onMessage);
    win.postMessage({{perfetto: {{buffer: bytes(), title: NAME, fileName: NAME}}}}, ORIGIN);
    status.textContent = "Sent to Perfetto ({len(data):,} bytes, gzipped).";
  }});
}};
</script>""", height=90)
