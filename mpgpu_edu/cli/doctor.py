"""``mpgpu-edu doctor [--json]``: is this machine ready for the course?

Exit status 0 when the course can run (no check failed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json

from mpgpu_edu.measure import doctor


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="is this machine ready for the course?",
                            description="Check Python, torch, GPUs, CUDA_VISIBLE_DEVICES, gloo, "
                            "a loopback port, JupyterLab, ipywidgets and matplotlib.")
    parser.add_argument("--json", action="store_true",
                        help='print {"checks": [...], "ok": bool} instead of a table')
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    checks = doctor.run_checks()
    if args.json:
        print(json.dumps(doctor.to_json(checks), indent=2))
    else:
        print("mpgpu-edu doctor: is this machine ready for the course?")
        print(doctor.format_table(checks))
    return 0 if doctor.course_can_run(checks) else 1
