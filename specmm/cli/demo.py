"""`specmm demo`: build the reference models if needed and run the main job side by side."""

from __future__ import annotations

from specmm.cli.common import default_device, device_arg, scale_argument


def cmd_demo(args) -> int:
    from specmm.demo import run_demo

    run_demo(scale=args.scale, out=args.out, device=args.device, build_all=args.all)
    return 0


def add_parser(sub) -> None:
    demo = sub.add_parser("demo", help="build the reference models if needed and run the main job side by side")
    scale_argument(demo)
    demo.add_argument("--all", action="store_true",
                      help="also build (once) and run every section whose zoo entries are not built yet")
    demo.add_argument("--device", type=device_arg, default=default_device(),
                      help="torch device the models run on")
    demo.add_argument("--out", default="demo_report.html", help="the HTML report (inputs, outputs, tables)")
    demo.set_defaults(func=cmd_demo)


__all__ = ["add_parser", "cmd_demo"]
