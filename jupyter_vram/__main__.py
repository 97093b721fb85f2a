"""`python -m jupyter_vram`: record the built-in example, or summarise a saved profile."""

from __future__ import annotations

import argparse
import sys

import torch

from .model import Profile
from .recording import record
from .render.text import summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_vram")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="record two training steps of a small GPT and report")
    demo.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--save", default="vram_profile.json.gz", help="where to save the profile")
    show = sub.add_parser("show", help="summarise a saved profile")
    show.add_argument("path")
    args = parser.parse_args(argv)

    if args.command == "show":
        try:
            print(summary(Profile.load(args.path)))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0

    from .examples import training_step

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    _, _, step = training_step(device=device)
    step()  # the first step creates the optimizer state; record the steady state
    with record(device) as rec:
        step()
    print(summary(rec.profile))
    rec.profile.save(args.save)
    print(f"\nprofile saved to {args.save} (load it with jupyter_vram.Profile.load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
