"""`python -m jupyter_vram`: record the built-in example, or summarise a saved profile.

``report``, ``compare`` and ``run`` are the ``jupyter-vram`` command's (see _cli.py); ``estimate``
here is the built-in example's estimate (``jupyter-vram estimate`` takes any model).
"""

from __future__ import annotations

import argparse
import sys

import torch

from ._model import Profile, ProfileFileError
from ._recording import record
from ._render.text import summary


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in and args_in[0] in ("report", "compare", "run"):  # the jupyter-vram command's
        from ._cli import main as cli_main

        return cli_main(args_in)
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_vram",
        epilog="also: report, compare, run (the jupyter-vram command's; see jupyter-vram --help)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="record two training steps of a small GPT and report")
    demo.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--save", default="vram_profile.json.gz", help="where to save the profile")
    show = sub.add_parser("show", help="summarise a saved profile")
    show.add_argument("path")
    est = sub.add_parser("estimate", help="predict the small GPT's training step on a GPU")
    est.add_argument("--batch-size", type=int, default=8)
    est.add_argument("--gpu", default="T4", help="GPU for the largest-batch search")
    args = parser.parse_args(args_in)

    if args.command == "estimate":
        return estimate_demo(args.batch_size, args.gpu)

    if args.command == "show":
        try:
            profile = Profile.load(args.path)
        except ProfileFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(summary(profile))
        return 0

    from .examples import training_step

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    _, _, step = training_step(device=device)
    step()  # the first step creates the optimizer state; record the steady state
    with record(device, stacks="full") as rec:  # exact lines: the same report every run
        step()
    print(summary(rec.profile))
    rec.profile.save(args.save)
    print(f"\nprofile saved to {args.save} (load it with jupyter_vram.Profile.load)")
    return 0


def estimate_demo(batch_size: int, gpu: str) -> int:
    """Estimate the built-in small GPT without a GPU: summary, fit, largest batch, what-ifs."""
    import torch.nn.functional as F

    from ._estimator import EstimateError, estimate, find_gpu
    from ._estimator.api import estimate_summary
    from ._estimator.search import format_batch
    from ._render.estimate_text import what_if_text
    from .examples import TinyGPT

    def next_token_loss(
        logits: torch.Tensor, batch: tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]
    ) -> torch.Tensor:
        ids = batch[0][0]
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten())

    with torch.device("meta"):
        model = TinyGPT()
    try:
        target = find_gpu(gpu)
        result = estimate(model, f"{batch_size}x128", loss_fn=next_token_loss)
        print(estimate_summary(result))
        largest = result.max_batch_size(target)
        print(f"\nlargest batch that fits {target.name}: {format_batch(largest)}\n")
        print(what_if_text(result.what_ifs(gpus=8)))
    except (EstimateError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
