"""``collage-farm zoo``: list the built-in and packaged models, export a built-in one to ONNX."""

from __future__ import annotations

import argparse
from typing import Any

from collage_farm import zoo
from collage_farm.cli.errors import UserError
from collage_farm.zoo import packaged

__all__ = ["add_zoo_parser", "run_zoo"]


def add_zoo_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``zoo list`` and ``zoo export`` on the main parser's subcommands."""
    p = sub.add_parser("zoo", help="built-in models (built in code, seeded weights)")
    zs = p.add_subparsers(dest="zoo_cmd", required=True)
    zs.add_parser("list", help="list the models")
    e = zs.add_parser("export", help="write a model to an ONNX file")
    e.add_argument("name", help="a built-in model (see `collage-farm zoo list`)")
    e.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the ONNX file to write")
    e.add_argument("--layers", type=int,
                   help="layers of a transformer model (default: the model's own)")
    e.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights (default 0: the same model every time)")


def run_zoo(args: argparse.Namespace) -> int:
    """``collage-farm zoo``: 0; an unknown model name is a `UserError`."""
    if args.zoo_cmd == "list":
        for name in zoo.names():
            print(f"{name:14s} {zoo.describe(name)}")
        _list_packaged()
        return 0
    kw: dict[str, Any] = {"seed": args.seed}
    if args.layers is not None:
        kw["layers"] = args.layers
    try:
        zoo.export(args.name, args.output, **kw)
    except KeyError as e:
        raise UserError(str(e.args[0]) if e.args else str(e)) from None
    print(f"wrote {args.output}")
    return 0


def _list_packaged() -> None:
    """Real exported models from pip wheels (``pkg:NAME``), and whether each is here."""
    print("\nreal exported models from pip packages (use as pkg:NAME; default shapes apply "
          "to inputs without --shape):")
    for name in packaged.names():
        e = packaged.get(name)
        state = ("installed" if packaged.installed(name)
                 else f"not installed: {e.install_command}")
        shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in e.shapes.items())
        print(f"pkg:{name:12s} {e.requirement} [{state}] {shapes}. {e.description}")
