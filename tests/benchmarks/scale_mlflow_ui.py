"""The MLflow UI with a big sweep (issue 19): its pages timed in Debian's headless Chromium, screenshots kept.

Starts ``headsweep ui`` on a free 127.0.0.1 port against the sweep's store and drives Chromium
through its DevTools protocol over a pipe (``--remote-debugging-pipe``: no port, no extra
package): each page is timed from navigation until what a user came for shows, and screenshotted:

- the experiment's runs table until the sweep's parent row shows; the row expanded until its
  first children show, and how many runs the table has loaded (MLflow loads 100 a page), then
  "Load more" until every child is loaded (clicks and seconds);
- the parent run's page until its "Child runs" list shows, and how many it links (MLflow: 10);
- the parent's description (``orchestrator.tracking.sweep_note``): its search links, and two of
  them followed: every run of the sweep, and one cell's seeds (``tags.cell``), each until the runs
  show, with how many the search found.

scale_sweep.py calls :func:`check_ui` on its sweep; alone, on a kept home (``scale_sweep.py --keep``):

    HEADSWEEP_HOME=/tmp/headsweep_scale_home_x .venv/bin/python tests/benchmarks/scale_mlflow_ui.py [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from scale_sweep import free_port, start_server, stop_server

WINDOW = (1600, 1000)
MAX_LOAD_MORE = 60  # clicks of "Load more" before giving up (MLflow loads 100 runs per click)


class Browser:
    """Headless Chromium driven through the DevTools protocol on a pipe (fds 3 and 4 of the child:
    NUL-terminated JSON messages), attached to its one page."""

    def __init__(self, executable: str) -> None:
        commands_r, commands_w = os.pipe()
        replies_r, replies_w = os.pipe()

        def onto_3_and_4() -> None:  # in the child, before exec: where --remote-debugging-pipe looks
            os.dup2(commands_r, 3)
            os.dup2(replies_w, 4)

        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", "about:blank"],
            preexec_fn=onto_3_and_4, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        os.close(commands_r)
        os.close(replies_w)
        self._send, self._receive = os.fdopen(commands_w, "wb", buffering=0), os.fdopen(replies_r, "rb", buffering=0)
        self._buffer, self._id = b"", 0
        page = next(t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self._session = self._call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def _message(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = self._receive.read(1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        self._send.write(json.dumps({"id": self._id, "method": method, "params": params}
                                    | ({"sessionId": session} if session else {})).encode() + b"\0")
        while True:  # events (no id) and nothing else arrive in between
            reply = self._message()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self._call("Runtime.evaluate", self._session, expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    def go(self, url: str) -> float:
        """Load ``url`` afresh, as a new tab would (the UI is one page: a new hash alone would keep
        the last page's table on screen for a while); the time it started (``time.perf_counter``)."""
        self._call("Page.navigate", self._session, url="about:blank")
        self.until("document.readyState === 'complete' && location.href === 'about:blank'", time.perf_counter())
        started = time.perf_counter()
        self._call("Page.navigate", self._session, url=url)
        return started

    def until(self, expression: str, since: float, limit_s: float = 120) -> float | None:
        """Seconds from ``since`` until ``expression`` is truthy (polled every 50 ms); None past ``limit_s``."""
        while time.perf_counter() - since < limit_s:
            if self.js(expression):
                return time.perf_counter() - since
            time.sleep(0.05)
        return None

    def screenshot(self, path: Path) -> str:
        path.write_bytes(base64.b64decode(self._call("Page.captureScreenshot", self._session, format="png")["data"]))
        return path.name

    def close(self) -> None:
        try:
            self._call("Browser.close")
            self.process.wait(timeout=30)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=30)


def _text_has(text: str) -> str:
    return f"!!document.body && document.body.innerText.includes({json.dumps(text)})"


ROW_IDS = ("[...new Set([...document.querySelectorAll('[role=row][row-id]')].map(r => r.getAttribute('row-id'))"
           ".filter(id => /^[0-9a-f]{32}$/.test(id)))]")
"""The run ids of the runs table's rendered rows (not its "Load more" row)."""
MATCHING = "(document.body.innerText.match(/([0-9,]+) matching runs/) || [null, '0'])[1].replace(/,/g, '') * 1"
EXPAND = """(id => { const row = document.querySelector(`[role=row][row-id="${id}"]`);
  const button = row && [...row.querySelectorAll('button')].find(b => !b.innerText.trim() && !b.getAttribute('aria-label'));
  if (button) button.click(); return !!button; })"""
CHILDREN_LISTED = """(t => { const at = t.indexOf('Child runs\\n'); if (at < 0) return 0;
  return t.slice(at + 11, t.indexOf('\\nSource', at)).split('\\n').map(s => s.trim())
    .filter(s => s && s !== 'Load more').length; })(document.body.innerText)"""
"""How many children the run page's "Child runs" list names (0 while it loads)."""
LOAD_MORE = """(() => { document.querySelectorAll('.ag-body-viewport').forEach(v => { v.scrollTop = v.scrollHeight; });
  const button = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Load more');
  if (button) button.click(); return !!button; })()"""
"""Click the runs table's "Load more" (the grid renders only the rows in view: scroll to its end first)."""


def _expanded(browser: Browser, parent: str, since: float, limit_s: float = 120) -> float | None:
    """Expand the sweep's row once it shows; seconds from ``since`` until a child row shows under
    it. A click the table swallows (it was still rendering) is clicked again every few seconds."""
    children = f"{ROW_IDS}.filter(id => id !== {json.dumps(parent)}).length > 0"
    while time.perf_counter() - since < limit_s:
        if browser.js(children):
            return time.perf_counter() - since
        if browser.js(f"{EXPAND}({json.dumps(parent)})"):
            browser.until(children, time.perf_counter(), limit_s=5)
        else:
            time.sleep(0.05)
    return None


def check_ui(sweep_id: str, env: dict[str, str], out: Path) -> list[tuple[str, float, str, dict]]:
    """Time the MLflow UI's pages for the sweep (see the module's docstring); screenshots under
    ``out``. Returns (figure, value, unit, detail) rows (``ok``: False where a page never showed what
    it should); one ``chromium`` row saying why it skipped when Debian's chromium is not installed."""
    from orchestrator import settings, tracking
    from orchestrator.registry import Registry

    executable = shutil.which("chromium")
    if executable is None:
        return [("chromium", float("nan"), "", {"skipped": "Debian's chromium is not installed (apt-get install chromium)"})]
    registry = Registry(settings.registry_url())
    sweep, counts = registry.get_sweep(sweep_id), registry.sweep_counts(sweep_id)
    experiment, parent, children = sweep["mlflow_experiment_id"], sweep["mlflow_parent_run_id"], sum(counts.values())
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    server, start_s = start_server(["ui", "--port", str(port)], env, f"{base}health", out / "mlflow_ui.log")
    rows = [("server_start", start_s, "s", {})]
    browser = Browser(executable)
    try:
        since = browser.go(f"{base}#/experiments/{experiment}/runs?workflowType=machine_learning")
        shown = browser.until(_text_has(sweep_id), since)
        rows.append(("experiment_page", shown, "s", {"ok": shown is not None, "until": "the sweep's row shows",
                                                     "screenshot": browser.screenshot(out / "experiment.png")}))
        since = time.perf_counter()
        shown = _expanded(browser, parent, since)
        rows.append(("expand_sweep", shown, "s", {
            "ok": shown is not None, "until": "its first children show", "children": children,
            "loaded": browser.js(MATCHING), "screenshot": browser.screenshot(out / "experiment_expanded.png")}))
        since, clicks = time.perf_counter(), 0
        while browser.js(MATCHING) < children + 1 and clicks < MAX_LOAD_MORE:
            loaded = browser.js(MATCHING)
            if browser.until(LOAD_MORE, time.perf_counter(), limit_s=10) is None:
                break  # no "Load more" any more
            clicks += 1
            browser.until(f"{MATCHING} > {loaded}", time.perf_counter(), limit_s=60)
        rows.append(("load_every_child", time.perf_counter() - since, "s", {
            "ok": browser.js(MATCHING) >= children + 1, "load_more_clicks": clicks, "loaded": browser.js(MATCHING),
            "children": children}))

        since = browser.go(f"{base}#/experiments/{experiment}/runs/{parent}?workflowType=machine_learning")
        shown = browser.until(f"{CHILDREN_LISTED} > 0", since)
        browser.until(f"{CHILDREN_LISTED} >= {min(children, 10)}", time.perf_counter(), limit_s=30)  # it fills in
        links = browser.js(CHILDREN_LISTED)
        rows.append(("parent_page", shown, "s", {"ok": shown is not None, "until": "its Child runs list names a child",
                                                 "children_linked": links, "children": children,
                                                 "screenshot": browser.screenshot(out / "parent.png")}))
        note = browser.js("[...document.querySelectorAll('a')].map(a => [a.innerText, a.getAttribute('href') || ''])"
                          ".filter(([, h]) => h.includes('searchFilter'))")
        browser.js("(a => a && a.scrollIntoView({block: 'center'}))([...document.querySelectorAll('a')]"
                   ".find(a => (a.getAttribute('href') || '').includes('searchFilter')))")
        rows.append(("parent_note_links", len(note), "links", {"ok": bool(note),
                                                               "screenshot": browser.screenshot(out / "parent_note.png")}))
        page = min(children, 100)  # the table loads 100 runs at a time: the first page must be full
        for name, pattern in (("note_every_run", "every run"), ("note_one_cell", "tags.cell")):
            href = next((h for text, h in note if pattern in text), None)
            if href is None:
                rows.append((name, float("nan"), "s", {"ok": False, "error": f"no '{pattern}' link in the description"}))
                continue
            search = parse_qs(urlsplit(href).fragment.split("?", 1)[1])["searchFilter"][0]
            expected = page if pattern == "every run" else len(tracking.client().search_runs([experiment], search))
            since = browser.go(base + href)
            shown = _expanded(browser, parent, since) if browser.until(_text_has(sweep_id), since) is not None else None
            found = browser.js(MATCHING) - 1  # the table counts the sweep's row too
            rows.append((name, shown, "s", {"ok": shown is not None and found >= expected, "search": search,
                                            "found": found, "expected": expected,
                                            "screenshot": browser.screenshot(out / f"{name}.png")}))
    finally:
        browser.close()
        stop_server(server, 15)
    return [(name, float("nan") if value is None else value, unit, detail) for name, value, unit, detail in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", nargs="?", default="last", help="a sweep of HEADSWEEP_HOME's registry (default: last)")
    parser.add_argument("--out", help="folder for the screenshots (default: a new temp dir)")
    args = parser.parse_args(argv)
    from orchestrator import settings
    from orchestrator.registry import Registry

    out = Path(args.out or tempfile.mkdtemp(prefix="headsweep_ui_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sweep_id = Registry(settings.registry_url()).resolve_sweep(args.sweep)
    rows = check_ui(sweep_id, dict(os.environ), out)
    for name, value, unit, detail in rows:
        print(json.dumps({"bench": "scale_mlflow_ui", "figure": name, "value": round(value, 3), "unit": unit, **detail}))
    print(f"screenshots: {out}", file=sys.stderr)
    return 0 if all(detail.get("ok", True) for *_, detail in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
