#!/usr/bin/env python3
"""Download and verify the default models (`make models`).

    tools/fetch_models.py [--dir D] [--quiet] [--only target|draft]

Files go to D, else $LUCE_MODELS, else ~/.cache/luce/models; progress goes to stderr, the
paths of the verified files to stdout. Files already present and verified are not downloaded.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, FetchError, fetch  # noqa: E402

NAMES = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None,
                        help="model directory (default: $LUCE_MODELS or ~/.cache/luce/models)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--only", choices=sorted(NAMES), help="fetch just one of the two models")
    args = parser.parse_args(argv)
    wanted = [args.only] if args.only else ["target", "draft"]
    try:
        for role in wanted:
            print(fetch(NAMES[role], progress=not args.quiet, directory=args.dir))
    except FetchError as e:
        print(f"fetch_models: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fetch_models: interrupted; nothing partial was kept", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
