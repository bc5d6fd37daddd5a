"""``kinetoscope app``: the Streamlit app, in a server process of its own."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    app = sub.add_parser(
        "app",
        help="open the Streamlit app (on the bundled sample traces unless PATHs are given)",
        description="Start the Kinetoscope web app. With no PATH it opens the bundled sample traces.",
    )
    app.add_argument("paths", nargs="*", metavar="PATH", help="traces or rank directories to open")
    app.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    app.add_argument("--headless", action="store_true", help="do not open a browser")
    app.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    app.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    from kinetoscope.app.launch import launch

    return launch(args.paths, port=args.port, headless=args.headless)


