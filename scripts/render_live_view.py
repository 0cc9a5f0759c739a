"""Render the live view of one real ``tcrag ask`` run as an SVG picture (the one the README opens with).

    python scripts/render_live_view.py                      # Qwen2.5-Coder-1.5B, pulled with `tcrag pull`
    python scripts/render_live_view.py --model /work/models/qwen2.5-coder-1.5b-instruct.gguf
    python scripts/render_live_view.py --model local --out /tmp/smol.svg --max-steps 3

It runs the command line itself (``python -m tcrag_langgraph.faces.cli ask``, the same as ``tcrag ask``)
once, in a subprocess whose stdout looks to rich like a terminal of fixed width that keeps its colours
but cannot redraw lines (``TTY_COMPATIBLE=1``, ``TTY_INTERACTIVE=0``): the picture then holds exactly
what a user's terminal keeps after the run (every push, pop and state value against sigma, then the
answer) and not the transient token-by-token line, which the CLI shows on interactive terminals only.
The captured ANSI text is replayed into a recording rich console and exported as SVG.

Decoding is greedy (``--temperature 0 --seed 0`` unless given otherwise), so the same model, question
and flags draw the same picture. Every argument the script does not know goes to ``tcrag ask`` as it is
(``--max-steps 6``, ``--threads 2``, ``--scripted script.json``, ...). Nothing is downloaded: a catalogue
name needs ``tcrag pull`` first, or pass the .gguf path.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
DEFAULT_QUESTION = "Which vitamin deficiency causes scurvy?"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "live_view.svg"
# greedy decoding, so the picture is reproducible; a flag given on the command line replaces its default
DEFAULT_ASK_FLAGS = {"--temperature": "0", "--seed": "0"}


def ask_command(model: str, question: str, extra: list[str]) -> list[str]:
    """The ``tcrag ask`` command line the picture is rendered from."""
    command = [sys.executable, "-m", "tcrag_langgraph.faces.cli", "ask", question]
    if "--scripted" not in extra:  # ask refuses --model together with --scripted (a replayed script is no model)
        command += ["--model", model]
    for flag, value in DEFAULT_ASK_FLAGS.items():
        if not any(arg == flag or arg.startswith(flag + "=") for arg in extra):
            command += [flag, value]
    return command + extra


def run_live_view(command: list[str], width: int) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``command`` once with its stdout rendered as a ``width``-column colour terminal; its result and seconds."""
    env = dict(os.environ)
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):  # the caller's terminal settings must not change the picture
        env.pop(name, None)
    env.update({
        "COLUMNS": str(width), "LINES": "50",
        "TTY_COMPATIBLE": "1",   # colours, as on a terminal, although stdout is a pipe
        "TTY_INTERACTIVE": "0",  # but no redrawn lines: the CLI leaves out the transient reply line
        "TERM": "xterm-256color",
    })
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    return done, time.perf_counter() - start


def ansi_to_svg(ansi: str, width: int, title: str) -> str:
    """The SVG of ``ansi`` (a terminal's text with colour codes) as a ``width``-column terminal shows it."""
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(Text.from_ansi(ansi.rstrip("\n")), soft_wrap=False)
    return console.export_svg(title=title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments are passed to `tcrag ask` unchanged.")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"a catalogue name, a .gguf path or 'local' (the packaged SmolLM2); default {DEFAULT_MODEL}")
    parser.add_argument("--question", default=DEFAULT_QUESTION, help=f"default: {DEFAULT_QUESTION!r}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the SVG to write (default docs/images/live_view.svg)")
    parser.add_argument("--width", type=int, default=100, help="terminal columns (default 100)")
    args, extra = parser.parse_known_args(argv)

    command = ask_command(args.model, args.question, extra)
    print("running:", shlex.join(command), flush=True)
    done, seconds = run_live_view(command, args.width)
    print(f"took {seconds:.1f} s (exit status {done.returncode})")
    # 0: an answer; 1: a run that ended without one, still a true picture of the run; anything else failed
    if done.returncode not in (0, 1) or not done.stdout.strip():
        sys.stderr.write(done.stderr[-4000:])
        print("no picture: tcrag ask failed", file=sys.stderr)
        return 2

    shown_model = "scripted" if "--scripted" in extra else Path(args.model).stem if args.model.endswith(".gguf") else args.model
    title = f'tcrag ask "{args.question}" --model {shown_model}'
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(ansi_to_svg(done.stdout, args.width, title), encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
