from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from dplint.analysis.facts import scan_distributed
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.names import dotted, signed_integer_value
from dplint.edits import import_edit, module_name
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid
from dplint.analysis.ddp import argument, calls_in, in_distributed_program, is_literal, program_or_file


class LocalRankArgument(Rule):
    """
    ## What it does
    Finds `parser.add_argument("--local_rank", ...)` in a project that never reads the `LOCAL_RANK`
    environment variable and does not also accept `--local-rank`.

    ## Why is this bad?
    `torchrun` sets `LOCAL_RANK` in the environment and passes no argument, so every process gets the
    argument's default and every rank selects the same GPU (`cuda:0`): out-of-memory errors, slowdowns or
    hangs. `python -m torch.distributed.launch` from PyTorch 2.0 on passes the dashed `--local-rank=N`,
    which this parser rejects ("unrecognized arguments").

    ## Example
    ```python
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    torch.cuda.set_device(args.local_rank)
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    ```
    or, to keep supporting the old launcher, accept both spellings with
    `parser.add_argument("--local-rank", "--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))`.

    ## Fix safety
    The fix takes the argument's default from the environment, so torchrun's ranks each get their own,
    and `--local_rank` from the old launcher still overrides it: an integer default `d` becomes
    `int(os.environ.get("LOCAL_RANK", d))`; with `type=int`, a default of None (or none) becomes
    `os.environ.get("LOCAL_RANK")`, which argparse converts with `type`. `import os` is added where the
    file lacks it. It is unsafe: every rank then takes another GPU than the default, which is the point,
    and the same holds for any program run in an environment that sets `LOCAL_RANK`. Other defaults get
    no fix.

    ## Known problems
    Only a file of a program that starts a process group (or wraps a model in DDP) is checked: a
    one-process script that takes `--local_rank` for its device has no ranks. A mention of
    `"LOCAL_RANK"` in a file of the program that also selects a device or starts the process group
    counts as reading it (one in a checkpoint helper that only lets one process per node download does
    not). The argument must be read (`args.local_rank`, `para["local_rank"]`) somewhere in the program,
    and the program must have no other source of the local rank: an overwrite of `.local_rank` (also
    as one of several targets, `args.local_rank, args.rank = get_envs()`), a fallback
    (`args.local_rank or ...`), a rank modulo `torch.cuda.device_count()`, `mp.spawn`'s process index,
    or the DeepSpeed launcher (which passes `--local_rank`) silence it.
    """

    code = "DPL510"
    name = "local-rank-argument"
    summary = "`--local_rank` read only from argparse: torchrun passes none, so every rank gets the default GPU."
    fix_applicability = ("unsafe",)
    triggers = GuardedPattern(r"[\"']--local_rank[\"']", ["--local_rank"])

    VALID = [
        Valid(
            """
            import argparse, os
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
            """
        ),
        Valid(
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
            """
        ),
        Valid(
            """
            import argparse, os
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if "LOCAL_RANK" in os.environ:
                args.local_rank = int(os.environ["LOCAL_RANK"])
            """
        ),
        Valid(
            """
            import argparse
            # The option only accepts the old launcher's argument; the rank's GPU comes from elsewhere.
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=0)
            args = parser.parse_args()
            """
        ),
        Valid(
            """
            import argparse
            import torch.distributed as dist
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            dist.init_process_group("nccl")
            args.local_rank = dist.get_rank() % args.gpus_per_node
            """
        ),
        Valid(
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=None)
            args = parser.parse_args()
            local_rank = args.local_rank or rank % torch.cuda.device_count()
            """
        ),
        Valid(
            """
            import argparse
            import deepspeed  # the deepspeed launcher passes --local_rank=N to every rank
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            torch.cuda.set_device(args.local_rank)
            """
        ),
        Valid(
            """
            import argparse
            parser = argparse.ArgumentParser()  # a one-process demo: no process group, no ranks
            parser.add_argument("--local_rank", type=int, default=0)
            args = parser.parse_args()
            model = get_model(args.model, local_rank=args.local_rank).to("cuda")
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=0)
            args = parser.parse_args()
            torch.cuda.set_device(args.local_rank)
            torch.distributed.init_process_group("nccl")
            """,
            line=3,
            expected_fix="""
            import argparse
            import os
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
            args = parser.parse_args()
            torch.cuda.set_device(args.local_rank)
            torch.distributed.init_process_group("nccl")
            """,
        ),
        Invalid(
            """
            import argparse

            def parse_args():
                parser = argparse.ArgumentParser(description="train")
                parser.add_argument('--local_rank', default=-1, type=int, help='node rank for distributed training')
                return parser.parse_args()

            def main():
                args = parse_args()
                if args.local_rank != -1:
                    torch.distributed.init_process_group(backend="nccl")
            """,
            line=5,
        ),
        Invalid(
            """
            from argparse import ArgumentParser
            from torch.nn.parallel import DistributedDataParallel
            p = ArgumentParser()
            p.add_argument("--epochs", type=int)
            p.add_argument(
                "--local_rank",
                type=int,
            )
            para = vars(p.parse_args())
            device = f"cuda:{para['local_rank']}"
            model = DistributedDataParallel(model.to(device), device_ids=[device])
            """,
            line=5,
            expected_fix="""
            from argparse import ArgumentParser
            import os
            from torch.nn.parallel import DistributedDataParallel
            p = ArgumentParser()
            p.add_argument("--epochs", type=int)
            p.add_argument(
                "--local_rank",
                type=int, default=os.environ.get("LOCAL_RANK"),
            )
            para = vars(p.parse_args())
            device = f"cuda:{para['local_rank']}"
            model = DistributedDataParallel(model.to(device), device_ids=[device])
            """,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        if not in_distributed_program(ctx) or program_or_file(ctx).reads_local_rank_env or not _only_source_read(ctx):
            return  # a script that starts no process group has no ranks: its `--local_rank` picks a device
        for call in calls_in(ctx.module):
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
                continue
            options = _option_strings(call)
            if "--local_rank" in options and "--local-rank" not in options:
                fix = _default_from_environment(ctx, call)
                yield Report(
                    node=call,
                    message="`--local_rank` is the only source of the local rank: torchrun passes no such argument.",
                    help=f"{fix.message} (torchrun sets `LOCAL_RANK`; the old launcher's `--local_rank` still overrides it)."
                    if fix is not None
                    else 'Read `int(os.environ["LOCAL_RANK"])`, or accept "--local-rank" too with that as the default.',
                    fix=fix,
                )


def _only_source_read(ctx: FileContext) -> bool:
    """Whether the program reads the parsed local rank, and neither this file nor a file that reads it
    has another source of the local rank (a library file elsewhere in the program that calls `mp.spawn`
    says nothing about this script's ranks)."""
    files = ctx.project.files
    own = files[ctx.filename].distributed if ctx.filename in files else scan_distributed(ctx.source)
    if own is not None and own.other_local_rank_source:
        return False
    companions = [files[name].distributed for name in ctx.project.distributed.companions(ctx.filename) if name in files]
    readers = [facts for facts in (*companions, own) if facts is not None and facts.reads_local_rank_argument]
    return bool(readers) and not any(facts.other_local_rank_source for facts in readers)


def _default_from_environment(ctx: FileContext, call: cst.Call) -> Optional[FixSpec]:
    """`default=int(os.environ.get("LOCAL_RANK", -1))` for an integer default; with `type=int`, a default
    of None (or none) becomes `os.environ.get("LOCAL_RANK")`, which argparse converts with `type`."""
    if any(arg.star for arg in call.args):
        return None
    os_name = module_name(ctx, "os")
    environ = f"{os_name or 'os'}.environ"
    default, type_ = argument(call, "default"), argument(call, "type")
    if default is not None and signed_integer_value(default) is not None:
        value = f'int({environ}.get("LOCAL_RANK", {ctx.code(default)}))'
        edit = NodeEdit(default, value)
    elif (default is None or is_literal(default, None)) and type_ is not None and dotted(type_) == "int":
        value = f'{environ}.get("LOCAL_RANK")'
        edit = NodeEdit(default, value) if default is not None else NodeEdit(call.args[-1], f", default={value}", insert_after=True)
    else:
        return None
    edits = [edit]
    if os_name is None:
        added = import_edit(ctx, "import os", "os", call)
        if added is None:
            return None
        edits.append(added)
    return FixSpec(f"Take the default from the environment: `default={value}`", tuple(edits), "unsafe")


def _option_strings(call: cst.Call) -> List[str]:
    found = []
    for arg in call.args:
        if arg.keyword is None and isinstance(arg.value, cst.SimpleString):
            found.append(arg.value.evaluated_value)
    return found
