from __future__ import annotations

import re
from typing import FrozenSet, Iterator, Optional, Sequence, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.names import decimal_value, iter_calls, iter_small_statements
from dplint.analysis.patterns import GuardedPattern
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid

# c10/core/Device.cpp parses "type[:index]" with this grammar; the type is case-sensitive.
DEVICE = re.compile(r"(?P<type>[a-zA-Z_]+)(?::(?P<index>[1-9]\d*|0))?")
DEVICE_TYPES = frozenset(
    "cpu cuda mps xpu xla meta hpu ipu mtia hip ve fpga maia vulkan metal ideep mkldnn opengl opencl lazy "
    "privateuseone".split()
)
# In `.to("…")`, only strings that look like devices are checked: pint's `q.to("meter")` is not one.
DEVICE_LIKE = re.compile(r"cuda|cpu|gpu|mps|xpu|^\s*-?\d+\s*$", re.I)
DEVICE_KEYWORDS = frozenset({"device", "map_location"})


def is_valid(text: str, backends: FrozenSet[str] = frozenset()) -> bool:
    """Whether torch parses `text` as a device, given the out-of-tree device types the program registers."""
    match = DEVICE.fullmatch(text)
    return match is not None and (match.group("type") in DEVICE_TYPES or match.group("type") in backends)


def registered_backends(ctx: FileContext) -> FrozenSet[str]:
    """Device types an out-of-tree backend adds to the program: a PrivateUse1 package registers its own name on
    import, wherever the project imports it (`import torch_npu` makes "npu" a device type, as torch_mlu and
    torch_musa do theirs), as does `torch.utils.rename_privateuse1_backend("npu")` in this file."""

    def compute() -> FrozenSet[str]:
        packages = {module.split(".")[0] for module in ctx.imports.modules()} | ctx.project.imported_packages
        names = {package[len("torch_") :] for package in packages if package.startswith("torch_")}
        for statement in iter_small_statements(ctx.module.body):
            for call in iter_calls(statement):
                if ctx.qualify(call.func) == "torch.utils.rename_privateuse1_backend" and call.args:
                    value = call.args[0].value
                    if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
                        names.add(value.evaluated_value)
        return frozenset(names)

    return ctx.memo("registered_backends", compute)


def suggestion(text: str) -> Tuple[Optional[str], str]:
    """What the string most likely meant, and whether rewriting to it is "safe" or "unsafe"."""
    squeezed = re.sub(r"\s+", "", text).lower()
    if is_valid(squeezed):
        return squeezed, "safe"  # only spaces or case were wrong
    gpu = re.fullmatch(r"gpu(:\d+)?", squeezed)
    if gpu:
        return "cuda" + (gpu.group(1) or ""), "unsafe"  # "gpu" usually means CUDA, but could mean mps
    index = decimal_value(squeezed)
    if index is not None:
        return f"cuda:{index}", "unsafe"
    return None, ""


class InvalidDeviceString(Rule):
    """
    ## What it does
    Checks literal device strings passed to `torch.device`, `.to`, `.cuda`, or a `device=` /
    `map_location=` argument of a torch function for strings torch rejects: `"cuda: 0"`,
    `"cuda:0 "`, `"CUDA:0"`, `"gpu"`, `"gpu:0"`, `"0"`, `"cuda:-1"`, and f-strings whose constant
    part is already invalid (`f"cuda: {rank}"`).

    ## Why is this bad?
    torch parses device strings strictly (`type[:index]`, lowercase, no spaces) and raises
    `RuntimeError: Invalid device string`. The typo usually sits on the path that runs only when a
    GPU is present (`"cuda: 0" if torch.cuda.is_available() else "cpu"`), so every CPU test passes
    and the job fails on the GPU node, after its wait in the queue.

    ## Example
    ```python
    device = torch.device("cuda: 0" if torch.cuda.is_available() else "cpu")
    ```

    ## Use instead
    ```python
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    ```

    ## Fix safety
    Removing spaces or lowering the case of a valid device type is safe. `"gpu"` → `"cuda"` and
    `"0"` → `"cuda:0"` are offered as unsafe fixes: the intent is likely, not certain.

    ## Known problems
    Only literals written at the call are checked; a device string held in a variable is not
    followed. An out-of-tree device type (`"npu"`) is accepted where a file of the project imports
    its backend package (`torch_npu`, at any depth) or this file renames the PrivateUse1 backend
    itself. In `.to(...)`, strings that do not look like a device at all are left alone, since
    other libraries have `.to()` methods too (`quantity.to("meter")`).
    """

    code = "DPL102"
    name = "invalid-device-string"
    summary = "A device string that torch rejects (`\"cuda: 0\"`, `\"gpu\"`, `\"CUDA:0\"`)."
    fix_applicability = ("safe", "unsafe")
    triggers = GuardedPattern(
        r"(?:device|\.to|\.cuda|map_location)[ \t]*[=(]([^\n]*)", ["device", ".to", ".cuda", "map_location"], one_line=True
    )

    VALID = [
        Valid(
            """
            import torch
            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            x = torch.zeros(3, device="cuda")
            y = x.to(f"cuda:{rank}")
            """
        ),
        Valid(
            """
            distance = quantity.to("meter")  # pint, not torch
            label = "cuda: 0 is busy"  # a string that is not used as a device
            """
        ),
        Valid(
            """
            import lightgbm
            model = lightgbm.LGBMClassifier(device="gpu")  # not a torch call
            """
        ),
        Valid(
            """
            import torch
            state = torch.load("ckpt.pt", map_location="cpu")
            x = torch.ones(2).to("mps").to(torch.float16)
            """
        ),
        Valid(
            """
            import torch
            import torch_npu  # registers the "npu" device type on import
            device = torch.device(f"npu:{local_rank}" if torch.npu.is_available() else "cpu")
            """
        ),
        Valid(
            """
            import torch
            torch.utils.rename_privateuse1_backend("foo")
            x = torch.zeros(3, device="foo:0")
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = torch.device("cuda: 0" if torch.cuda.is_available() else "cpu")
            """,
            line=2,
            expected_fix="""
            import torch
            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            """,
        ),
        Invalid(
            """
            import torch
            x = torch.zeros(3, device="CUDA:0")
            """,
            line=2,
            expected_fix="""
            import torch
            x = torch.zeros(3, device="cuda:0")
            """,
        ),
        Invalid(
            """
            def move(batch):
                return batch.to("gpu")
            """,
            line=2,
            expected_fix="""
            def move(batch):
                return batch.to("cuda")
            """,
        ),
        Invalid(
            """
            import torch
            x = torch.ones(2).cuda(f"cuda: {rank}")
            """,
            line=2,
        ),
        Invalid(
            """
            import torch
            state = torch.load("ckpt.pt", map_location="cuda:-1")
            """,
            line=2,
        ),
        Invalid(
            """
            import torch
            import torch_npu
            device = torch.device(f"npu: {local_rank}")
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            device = torch.device(f"npu:{rank}")  # no backend registers "npu" here
            """,
            line=2,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """Whether a line with a device context (`device=`, `.to(`, …) holds an invalid device-like string."""
        for context in self.triggers.finditer(text):
            for literal in _LITERAL.finditer(context.group(1)):
                content = literal.group("content")
                if literal.group("f"):
                    if _invalid_fstring_prefix(content.split("{")[0]) and "{" in content:
                        return True
                elif DEVICE_LIKE.search(content) and not is_valid(content):
                    return True
        return False

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for statement in iter_small_statements(ctx.module.body):
            for call in iter_calls(statement):
                for argument, must_look_like_device in self._device_arguments(ctx, call):
                    report = self._check_argument(ctx, argument, must_look_like_device, statement)
                    if report is not None:
                        yield report

    @staticmethod
    def _device_arguments(ctx: FileContext, call: cst.Call) -> Iterator[Tuple[cst.BaseExpression, bool]]:
        """The call's arguments that are devices, each with whether it must look like a device first."""
        qualified = ctx.qualify(call.func)
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) and qualified is None else None
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if qualified == "torch.device" and positional:
            yield positional[0].value, False
        elif method in ("to", "cuda") and positional:
            yield positional[0].value, True
        for arg in call.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword in DEVICE_KEYWORDS and (method in ("to", "cuda") or (qualified or "").startswith("torch.")):
                yield arg.value, method is not None

    def _check_argument(self, ctx: FileContext, node: cst.BaseExpression, must_look_like_device: bool, statement) -> Optional[Report]:
        for string in _strings(node):
            if isinstance(string, cst.SimpleString):
                text = string.evaluated_value
                # The file's backends are looked up only for a string torch's own types reject.
                if not isinstance(text, str) or is_valid(text) or is_valid(text, registered_backends(ctx)):
                    continue
                if must_look_like_device and not DEVICE_LIKE.search(text):
                    continue
                return self._report(ctx, string, text, statement)
            head = string.parts[0] if string.parts else None
            if (
                isinstance(head, cst.FormattedStringText)
                and len(string.parts) > 1
                and _invalid_fstring_prefix(head.value)
                and _invalid_fstring_prefix(head.value, registered_backends(ctx))
            ):
                return self._report(ctx, string, head.value + "{…}", statement)
        return None

    @staticmethod
    def _report(ctx: FileContext, string: cst.BaseExpression, text: str, statement) -> Report:
        fixed, applicability = suggestion(text) if isinstance(string, cst.SimpleString) else (None, "")
        fix = None
        if fixed is not None and isinstance(string, cst.SimpleString) and text in string.value:
            quote_start = len(string.prefix) + len(string.quote)
            literal = string.value[:quote_start] + fixed + string.value[len(string.value) - len(string.quote) :]
            fix = FixSpec(f'Replace with "{fixed}"', (NodeEdit(string, literal),), applicability)
        return Report(
            node=string,
            message=f'`{ctx.short_code(string, 40)}` is not a device string torch accepts: it raises "Invalid device string".',
            help=f'Write `"{fixed}"`.' if fixed else 'Use `type[:index]`: lowercase, no spaces, e.g. `"cuda:0"`.',
            fix=fix,
            statement=statement,
        )


_LITERAL = re.compile(r"""(?P<f>\b[fF])?(?P<quote>["'])(?P<content>[^"'\n]{0,24})(?P=quote)""")


def _invalid_fstring_prefix(prefix: str, backends: FrozenSet[str] = frozenset()) -> bool:
    """`f"cuda: {i}"`, `f"gpu:{i}"`: the constant part before the index is already wrong."""
    kind = prefix.split(":")[0]
    return ":" in prefix and (" " in prefix or not is_valid(kind, backends))


def _strings(node: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The string literals an argument may evaluate to (both branches of a conditional expression)."""
    if isinstance(node, (cst.SimpleString, cst.FormattedString)):
        yield node
    elif isinstance(node, cst.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)

