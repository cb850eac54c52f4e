"""Argument definitions: the top-level parser, shared options, and the object commands' arguments.

Definitions only: handlers live in ``lace/cli/commands/``, output in ``render.py``. Other command
modules reuse the helpers here (``add_lab_option``, ``add_output_option``, ...).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

import lace
from lace.cli.errors import UsageError

OBJECT_OUTPUTS = ("json", "yaml", "name")
GET_OUTPUTS = ("json", "yaml", "wide", "name")


class HelpShown(Exception):
    """argparse printed help or the version: the command is done and succeeded."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, so ``main`` stays in-process."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", hint=f"run `{self.prog} --help` for usage")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise UsageError(message.strip() if message else f"{self.prog}: bad usage")
        raise HelpShown()


def add_lab_option(parser: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """``--lab NAME``: which lab (cluster) to talk to; also accepted after the subcommand."""
    parser.add_argument("--lab", metavar="NAME", default=None if top_level else argparse.SUPPRESS,
                        help="the lab to talk to (default: $LACE_LAB, else the one `lace lab up` made last)")


def add_output_option(parser: argparse.ArgumentParser, choices: tuple[str, ...] = OBJECT_OUTPUTS) -> None:
    """``-o/--output``: a table for humans unless one of ``choices`` is given."""
    parser.add_argument("-o", "--output", choices=choices, default=None,
                        help="output format: " + ", ".join(choices) + " (default: a table)")


def add_namespace_options(parser: argparse.ArgumentParser, *, all_namespaces: bool = True) -> None:
    parser.add_argument("-n", "--namespace", metavar="NS", default=None,
                        help="the namespace of namespaced objects (default: default)")
    if all_namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true",
                            help="every namespace (shows a NAMESPACE column)")


def add_selector_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-l", "--selector", metavar="SELECTOR", default=None,
                        help="label selector, e.g. 'app=web,tier!=db,env in (a,b),!legacy'")


def add_filename_option(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("-f", "--filename", metavar="FILE", action="append", required=required,
                        default=None, help="manifest file, directory or - for stdin (repeatable)")


def build_parser(modules: list[Any]) -> ArgumentParser:
    """The ``lace`` parser with every command module's subcommands registered."""
    parser = ArgumentParser(prog="lace", description="lace: an eBPF Kubernetes CNI — cluster commands.")
    parser.add_argument("--version", action="version", version=f"lace {lace.__version__}")
    add_lab_option(parser, top_level=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for module in modules:
        module.register(subparsers)
    return parser


# ---- the object commands (handlers in lace/cli/commands/{apply,get,delete}.py) -----------------

def define_apply(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("apply", help="create or update objects from manifests",
                              description="Create or update objects from YAML/JSON manifests. All "
                              "objects are validated first; if any is invalid nothing is written.")
    add_filename_option(p, required=True)
    p.add_argument("-n", "--namespace", metavar="NS", default=None,
                   help="namespace for namespaced objects that name none")
    p.add_argument("--dry-run", action="store_true", help="validate and report, write nothing")
    add_output_option(p)
    add_lab_option(p)
    return p


def define_get(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("get", help="show objects",
                              description="Show objects: pods, namespaces, nodes, networks, "
                              "networkpolicies, services, endpointslices, servicecidrs, "
                              "loadbalancerippools, and lace's allocations: segments, ipblocks, "
                              "ipleases, serviceallocations.")
    p.add_argument("kind", metavar="KIND", nargs="?",
                   help="object kind, e.g. pods, po, networks, netpol (or KIND/NAME)")
    p.add_argument("names", metavar="NAME", nargs="*", help="only these objects")
    add_namespace_options(p)
    add_selector_option(p)
    add_output_option(p, GET_OUTPUTS)
    add_lab_option(p)
    return p


def define_delete(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("delete", help="delete objects",
                              description="Delete the objects in manifests (-f) or named ones.")
    p.add_argument("kind", metavar="KIND", nargs="?", help="object kind (or KIND/NAME)")
    p.add_argument("names", metavar="NAME", nargs="*", help="objects to delete")
    add_filename_option(p, required=False)
    add_namespace_options(p, all_namespaces=False)
    add_selector_option(p)
    p.add_argument("--all", action="store_true", help="every object of KIND in the namespace")
    p.add_argument("--ignore-not-found", action="store_true",
                   help="treat objects that do not exist as deleted")
    add_output_option(p, ("name",))
    add_lab_option(p)
    return p
