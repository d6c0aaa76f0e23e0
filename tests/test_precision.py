"""Subtle cases for each rule: true negatives chosen as carefully as the positives."""

from __future__ import annotations

import textwrap

import pytest

from dplint import lint_source
from dplint.analysis.facts import scan_classes
from dplint.fixes import apply_fixes
from dplint.rules import CHECKS


def findings(source: str, select=None):
    return [(f.location.row, f.code) for f in lint_source(textwrap.dedent(source).lstrip("\n"), "case.py", select=select)]


DPL101_CASES = {
    "module subclass moved in place": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            pass
        model = Net()
        model.to("cuda")
        model.cuda()
        """,
        [],
    ),
    "rebinding to an unknown object makes the name unknown": (
        """
        import torch
        x = torch.zeros(3)
        x = Wrapper(x)
        x.to("cuda")
        """,
        [],
    ),
    "HF-style batch returned by a call": (
        """
        batch = tokenizer(texts, return_tensors="pt")
        batch.to("cuda")
        """,
        [],
    ),
    "module call results are unknown (tuples, ModelOutput)": (
        """
        import torch.nn as nn
        model = nn.Linear(3, 3)
        out = model(x)
        out.cpu()
        """,
        [],
    ),
    "chain ending in numpy is not a move": (
        """
        import torch
        x = torch.zeros(3)
        x.cpu().numpy()
        """,
        [],
    ),
    "moves inside expressions are used": (
        """
        import torch
        x = torch.zeros(3)
        print(x.cpu())
        ys = [x.to(d) for d in devices]
        f(x.cuda())
        """,
        [],
    ),
    "global tensor used in a function: reported, without an unsafe fix": (
        """
        import torch
        buf = torch.zeros(3)
        def f():
            buf.to("cuda")
        """,
        [(4, "DPL101")],
    ),
    "parameter kinds come from every call site": (
        """
        import torch
        def move(t, device):
            t.to(device)
        move(torch.ones(2), "cuda")
        move(graph, "cuda")
        """,
        [],
    ),
    "arithmetic on tensors is a tensor": (
        """
        import torch
        a = torch.ones(2)
        b = (a * 2 + 1).float()
        b.cuda()
        """,
        [(4, "DPL101")],
    ),
    "an nn.Parameter attribute has no safe fix but is reported": (
        """
        import torch
        import torch.nn as nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.zeros(3))
            def move(self):
                self.w.cuda()
        """,
        [(8, "DPL101")],
    ),
    "zip of two loaders": (
        """
        from torch.utils.data import DataLoader
        a = DataLoader(ds1)
        b = DataLoader(ds2)
        for (x, y), (u, v) in zip(a, b):
            x.cuda()
            v.cuda()
        """,
        [(5, "DPL101"), (6, "DPL101")],
    ),
    "enumerate index is not a tensor": (
        """
        from torch.utils.data import DataLoader
        loader = DataLoader(ds)
        for i, batch in enumerate(loader):
            i.to("cuda")
        """,
        [],
    ),
    "a local function named like a builtin is the one called": (
        """
        import torch
        def enumerate(x):
            return x
        for i, b in enumerate(torch.zeros(2, 2)):  # the rows of the tensor, not (index, row)
            i.cuda()
        """,
        [(5, "DPL101")],
    ),
    "string annotations are forward references": (
        """
        import torch
        def f(t: "torch.Tensor", m: "torch.nn.Module", u: "Unknown"):
            t.cuda()
            m.cuda()
            u.cuda()
        """,
        [(3, "DPL101")],
    ),
    "a tensor-returning annotated helper": (
        """
        import torch
        def make() -> torch.Tensor:
            return torch.zeros(1)
        make().cuda()
        t = make()
        t.cpu()
        """,
        [(4, "DPL101"), (6, "DPL101")],
    ),
    "methods tensors share with modules, PyG data, numpy or pandas prove nothing": (
        """
        def f(batch, frame, model, array):
            batch.contiguous().cuda()
            batch.pin_memory().to("cuda")
            model.half().cuda()
            model.requires_grad_(False).to("cuda")
            frame.div(255).to("cuda")
            array.reshape(1, -1).cpu()
        """,
        [],
    ),
    "a tensor compared with a tensor or a number is a tensor; `is`, `in` and chains are bools": (
        """
        import torch
        x = torch.zeros(3)
        a, b, c, d, e = x >= 0.5, x != x, x is None, x in things, 0 < x < 1
        a.cuda()
        b.cuda()
        c.cuda()
        d.cuda()
        e.cuda()
        """,
        [(4, "DPL101"), (5, "DPL101")],
    ),
    "only string keys of a return_tensors='pt' encoding are tensors": (
        """
        def f(processor, images, device):
            batch = processor(images=images, return_tensors="pt")
            batch["pixel_values"].to(device)
            batch[0].to(device)
            batch.to(device)
            other = processor(images=images, return_tensors="np")
            other["pixel_values"].to(device)
        """,
        [(3, "DPL101")],
    ),
    "a property is moved but never assigned back": (
        """
        import torch
        class Anchors:
            @property
            def grid(self):
                return torch.zeros(4, 2)

            def move(self, device):
                self.grid.to(device)
        """,
        [(8, "DPL101")],
    ),
}


@pytest.mark.parametrize("source, expected", DPL101_CASES.values(), ids=DPL101_CASES.keys())
def test_discarded_tensor_move(source, expected):
    assert findings(source, ["DPL101"]) == expected


def test_fix_is_offered_only_where_assigning_back_is_safe():
    global_case = lint_source("import torch\nbuf = torch.zeros(3)\ndef f():\n    buf.to('cuda')\n", select=["DPL101"])
    assert [f.fix for f in global_case] == [None]
    parameter_case = lint_source(textwrap.dedent(DPL101_CASES["an nn.Parameter attribute has no safe fix but is reported"][0]))
    assert [f.fix for f in parameter_case] == [None]


DPL2_CASES = {
    "function defined before but called after the assignment": (
        """
        import os
        import torch
        def init():
            torch.cuda.init()
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        init()
        """,
        [(5, "DPL202")],
    ),
    "a lambda does not run when defined": (
        """
        import os
        import torch
        check = lambda: torch.cuda.is_available()
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        """,
        [(4, "DPL202")],
    ),
    "the value is computed before the assignment": (
        """
        import os
        import torch
        os.environ["CUDA_VISIBLE_DEVICES"] = str(torch.cuda.current_device())
        """,
        [(3, "DPL201")],
    ),
    "a cuda tensor created through a device variable": (
        """
        import os
        import torch
        dev = torch.device("cuda:1")
        t = torch.ones(2, device=dev)
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        """,
        [(5, "DPL201")],
    ),
    "a device variable rebound to the cpu does not initialise": (
        """
        import os
        import torch
        dev = torch.device("cuda")
        dev = "cpu"
        t = torch.ones(2).to(dev)
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        """,
        [(6, "DPL202")],
    ),
    "DataParallel construction initialises CUDA": (
        """
        import os
        import torch.nn as nn
        model = nn.DataParallel(nn.Linear(2, 2))
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        """,
        [(4, "DPL201")],
    ),
    "reading the variable is not setting it": (
        """
        import os
        import torch
        torch.cuda.init()
        gpus = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        print(os.environ.get("CUDA_VISIBLE_DEVICES"))
        """,
        [],
    ),
    "an unrelated variable": (
        """
        import os
        import torch
        torch.cuda.init()
        os.environ["NCCL_DEBUG"] = "INFO"
        """,
        [],
    ),
    "from os import environ": (
        """
        from os import environ
        import torch
        torch.cuda.set_device(0)
        environ["CUDA_VISIBLE_DEVICES"] = "0"
        """,
        [(4, "DPL201")],
    ),
    "recursive functions terminate": (
        """
        import os
        import torch
        def a(n):
            if n:
                b(n - 1)
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        def b(n):
            a(n)
            torch.cuda.init()
        a(3)
        """,
        # b's init runs before the outer write only on the `if n:` path: possibly too late, not certainly.
        [(6, "DPL202")],
    ),
}


@pytest.mark.parametrize("source, expected", DPL2_CASES.values(), ids=DPL2_CASES.keys())
def test_cuda_visible_devices(source, expected):
    assert findings(source, ["DPL201", "DPL202"]) == expected


DPL2_CASES.update(
    {
        "CUDA initialised on every branch of an if/else counts": (
            """
            import os
            import torch
            if args.cpu:
                n = torch.cuda.device_count()
            elif args.one:
                torch.cuda.set_device(0)
            else:
                torch.cuda.init()
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """,
            [(9, "DPL201")],
        ),
        "CUDA initialised in a loop body or a try body may not have happened": (
            """
            import os
            import torch
            for gpu in gpus:
                torch.cuda.set_device(gpu)
            try:
                torch.cuda.init()
            except RuntimeError:
                pass
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """,
            [(9, "DPL202")],
        ),
        "a with body always runs": (
            """
            import os
            import torch
            with open("log") as log:
                torch.cuda.init()
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """,
            [(5, "DPL201")],
        ),
        "main() under the __main__ guard does not run before another file calls the helper": (
            """
            import os
            import torch

            def set_gpus(gpus):
                os.environ["CUDA_VISIBLE_DEVICES"] = gpus

            def main():
                torch.cuda.init()

            if __name__ == "__main__":
                main()
            """,
            [(5, "DPL202")],
        ),
    }
)


@pytest.mark.parametrize("source, expected", list(DPL2_CASES.values())[-4:], ids=list(DPL2_CASES.keys())[-4:])
def test_cuda_visible_devices_counts_cuda_as_initialised_only_on_every_path(source, expected):
    assert findings(source, ["DPL201", "DPL202"]) == expected


def test_device_count_message_explains_the_torch_version_caveat():
    [finding] = lint_source("import os, torch\nn = torch.cuda.device_count()\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n", select=["DPL201"])
    assert "torch < 2.4" in finding.message and "NVML" in finding.message
    assert "`torch.cuda.device_count()` on line 2" in finding.message


DPL301_CASES = {
    "a helper method's result is tracked": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                y = x.permute(1, 0, 2)
                return self.finish(y)
            def finish(self, y):
                return y
        m = nn.DataParallel(Net())
        """,
        [(4, "DPL301")],
    ),
    "a helper that permutes back, or returns something untracked on one path, is silent": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return self.restore(x.permute(1, 0, 2)) + self.maybe(x)
            def restore(self, y):
                return y.permute(1, 0, 2)
            def maybe(self, y, flag=False):
                if flag:
                    return y.transpose(0, 1)
                return self.encoder(y)
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "a helper calling itself ends the tracking": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return self.loop(x.permute(1, 0, 2))
            def loop(self, y):
                return self.loop(y)
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "the functional data_parallel with dim=1 gathers a time-major output correctly": (
        """
        import torch.nn as nn
        from torch.nn.parallel import data_parallel
        class Seq(nn.Module):
            def forward(self, x):
                return x.transpose(0, 1)
        ok = data_parallel(Seq(), batch, None, None, 1)
        """,
        [],
    ),
    "branches that disagree stop the tracking": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x, time_major=False):
                if time_major:
                    x = x.transpose(0, 1)
                return x
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "a branch that returns moved output": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x, time_major=False):
                if time_major:
                    return x.transpose(0, 1)
                return x
        m = nn.DataParallel(Net())
        """,
        [(5, "DPL301")],
    ),
    "movedim back to the front": (
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                y = torch.movedim(x, 0, 2)
                return y.movedim(2, 0)
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "swapping two inner dims keeps the batch": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x.transpose(1, 2).swapaxes(-1, -2)
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "the batch indexed away is not reported": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                y = x.permute(1, 0, 2)
                return y[:, 0]
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "rearrange keeping the batch leading": (
        """
        import torch.nn as nn
        from einops import rearrange
        class Net(nn.Module):
            def forward(self, x):
                return rearrange(x, "b c h w -> (b h) w c")
        m = nn.DataParallel(Net())
        """,
        [],
    ),
    "a dictionary output with a moved value": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                logits = x.transpose(0, 1)
                return {"logits": logits, "features": x}
        m = nn.DataParallel(Net())
        """,
        [(4, "DPL301")],
    ),
    "a wrapped subclass runs its base class's forward": (
        """
        import torch.nn as nn
        class Base(nn.Module):
            def forward(self, x):
                return x.t()
        class Child(Base):
            pass
        m = nn.DataParallel(Child())
        """,
        [(4, "DPL301")],
    ),
    "a dim that is not a literal is not guessed": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x.transpose(0, 1)
        m = nn.DataParallel(Net(), dim=args.dim)
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL301_CASES.values(), ids=DPL301_CASES.keys())
def test_batch_dim_moved(source, expected):
    assert findings(source, ["DPL301"]) == expected


def test_class_scan_reads_bases_and_forward_by_indentation():
    classes = scan_classes(
        textwrap.dedent(
            """
            class A(nn.Module):
                def forward(self, x):
                    return x

            class B(A, metaclass=Meta):
                pass
                class Inner(
                    torch.nn.Module,
                ):
                    async def forward(self): ...
            def forward(x):
                pass
            """
        )
    )
    assert [(c.name, c.bases, c.defines_forward) for c in classes] == [
        ("A", ("Module",), True),
        ("B", ("A",), False),
        ("Inner", ("Module",), True),
    ]


def test_class_scan_reads_the_constants_init_passes_to_the_base():
    classes = scan_classes(
        textwrap.dedent(
            """
            class Train(Encoder):
                def __init__(
                    self,
                    **kwargs,
                ):
                    super().__init__(**kwargs, is_inference=False, name="m", size=(1, 2))

            class Either(Encoder):
                def __init__(self, flag):
                    if flag:
                        super().__init__(is_inference=True)
                    else:
                        super().__init__(is_inference=False)

            class Nested(Encoder):
                def __init__(self):
                    def build():
                        super().__init__(is_inference=False)
                    build()

                def reset(self):
                    super().__init__(is_inference=False)
            """
        )
    )
    assert [(c.name, c.base_init_literals) for c in classes] == [
        ("Train", (("is_inference", False), ("name", "m"))),
        ("Either", ()),
        ("Nested", ()),
    ]


DPL302_CASES = {
    "an attribute set on the wrapper matters only to a model whose methods read it": (
        """
        import torch.nn as nn

        class Net(nn.Module):
            def forward(self, x):
                self.calls = 1
                return self.fc(x) if self.training_mode else x

        class Base(nn.Module):
            def forward(self, x):
                return x * self.scale

        class Scaled(Base):
            pass

        a = nn.DataParallel(Net())
        a.calls = 0
        a.training_mode = True
        b = nn.DataParallel(Scaled())
        b.scale = 2.0
        """,
        [(17, "DPL302"), (19, "DPL302")],
    ),
    "a module-level wrapper read in a function that the module calls after the wrap": (
        """
        import torch.nn as nn
        net = nn.DataParallel(Net())

        def show():
            print(net.fc)

        show()
        """,
        [(5, "DPL302")],
    ),
    "a name rebound inside a branch is no longer known to be the wrapper": (
        """
        import torch.nn as nn
        model = nn.DataParallel(model)
        if export:
            model = model.module
        model.encode(x)
        """,
        [],
    ),
    "inside the branch that wrapped it, the name is the wrapper": (
        """
        import torch.nn as nn
        if parallel:
            model = nn.DataParallel(model)
            model.encode(x)
        """,
        [(4, "DPL302")],
    ),
    "private and module attributes are the wrapper's own": (
        """
        import torch.nn as nn
        model = nn.DataParallel(model)
        print(model._modules, model.module.encode(x), model.training)
        model.module.flag = True
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL302_CASES.values(), ids=DPL302_CASES.keys())
def test_wrapper_attribute_access(source, expected):
    assert findings(source, ["DPL302"]) == expected


DPL302_MAY_BE_WRAPPED_CASES = {
    "a wrap under a device-count condition counts, and the message names its line and condition": (
        """
        import torch
        import torch.nn as nn
        model = Net()
        if torch.cuda.device_count() > 1:
            model = nn.DataParallel(model)
        model.encode(x)
        """,
        [(6, "DPL302")],
    ),
    "a wrap with .cuda() or .to(device) chained on it is still the wrapper": (
        """
        import torch.nn as nn
        a = nn.DataParallel(net_a).cuda()
        b = nn.DataParallel(net_b, device_ids=[0, 1]).to(device)
        a.encode(x)
        b.decode(x)
        """,
        [(4, "DPL302"), (5, "DPL302")],
    ),
    "an assignment after the merge forgets the wrap": (
        """
        import torch.nn as nn
        if args.multi_gpu:
            model = nn.DataParallel(model)
        model = build()
        model.encode(x)
        """,
        [],
    ),
    "the opposite branch of the wrap's condition cannot hold the wrapper": (
        """
        import torch.nn as nn
        if args.ngpu > 1:
            model = nn.DataParallel(model)
        if args.ngpu > 1:
            head = model.module.head
        else:
            head = model.head
        if args.ngpu == 1:
            model.freeze()
        if not args.ngpu > 1:
            model.freeze()
        """,
        [],
    ),
    "hasattr, isinstance and getattr tell the cases apart": (
        """
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel
        if distributed:
            model = DistributedDataParallel(model)
        if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
            model.module.encode(x)
        else:
            model.encode(x)
        if hasattr(model, "module"):
            model.module.flag = True
        else:
            model.flag = True
        getattr(model, "module", model).encode(x)
        (model.module if distributed else model).encode(x)
        inner = model.module if distributed else model
        inner.encode(x)
        """,
        [],
    ),
    "code after return is unreachable; a wrap in another function does not leak": (
        """
        import torch.nn as nn
        def build(model):
            model = nn.DataParallel(model)
            return model
            model.encode(x)
        def use(model):
            model.encode(x)
        """,
        [],
    ),
    "self.model wrapped in __init__ is the wrapper in other methods, not before the wrap": (
        """
        import torch.nn as nn
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.model.freeze_backbone()
                self.model = nn.DataParallel(self.model).cuda()

            def step(self, x):
                return self.model.compute_loss(x)

            def export(self):
                self.model = self.model.module
                return self.model.encoder
        """,
        [(9, "DPL302")],
    ),
    "a subclass in the same file inherits the base trainer's wrap": (
        """
        import torch.nn as nn
        class Base:
            def __init__(self, net, args):
                self.net = net
                if args.gpus > 1:
                    self.net = nn.DataParallel(self.net)

        class Sub(Base):
            def evaluate(self, x):
                return self.net.embed(x)
        """,
        [(10, "DPL302")],
    ),
    "an unrelated class with the same attribute is not the wrapper": (
        """
        import torch.nn as nn
        class Base:
            def __init__(self, net):
                self.net = nn.DataParallel(net)

        class Other:
            def evaluate(self, x):
                return self.net.embed(x)
        """,
        [],
    ),
    "FSDP forwards attribute reads": (
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
        model.encode(x)
        """,
        [],
    ),
    "an access whose test is a conjunction ruling out the wrap's branch": (
        """
        import torch
        def train(args, model, n_gpu):
            if args.local_rank != -1:
                model = ApexDDP(model)
            elif n_gpu > 1:
                model = torch.nn.DataParallel(model)
            if args.deepscale and args.local_rank != -1:
                model.disable_need_reduction()
            if args.deepscale or args.fp16:
                model.enable_need_reduction()
        """,
        [(10, "DPL302")],
    ),
    "a name unpacked from a call no longer holds the wrapper, here or in a helper it is passed to": (
        """
        import torch
        import deepspeed
        def save(model, path):
            model.save_checkpoint(path)
        def train(args, model, n_gpu):
            if n_gpu > 1:
                model = torch.nn.DataParallel(model)
            model, optimizer, _, _ = deepspeed.initialize(args=args, model=model)
            model.save_checkpoint(args.out)
            save(model, args.out)
        """,
        [],
    ),
    "one-line suites and a wrap in a loop": (
        """
        import torch.nn as nn
        if args.multi_gpu: model = nn.DataParallel(model)
        for _ in range(1): net = nn.DataParallel(net)
        model.encode(x); net.encode(x)
        """,
        [(4, "DPL302"), (4, "DPL302")],
    ),
}


@pytest.mark.parametrize("source, expected", DPL302_MAY_BE_WRAPPED_CASES.values(), ids=DPL302_MAY_BE_WRAPPED_CASES.keys())
def test_wrapper_attribute_access_on_some_path(source, expected):
    assert findings(source, ["DPL302"]) == expected


def test_wrapper_attribute_message_names_the_wrap_line_and_condition():
    source = """
    import torch
    import torch.nn as nn
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model.encode(x)
    """
    [finding] = lint_source(textwrap.dedent(source).lstrip("\n"), "case.py", select=["DPL302"])
    assert finding.message == (
        "`model` may be the DataParallel wrapper (line 4 if `torch.cuda.device_count() > 1`), which has no `encode`."
    )


DPL302_HASATTR_CASES = {
    "an `if hasattr` test on the wrapper, without an else that reaches `.module`": (
        """
        import torch
        import torch.nn as nn

        def finetune(model, loader):
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model)
            for batch in loader:
                if hasattr(model, "encoder"):
                    model.encoder.requires_grad_(False)
                model(batch).sum().backward()
        """,
        [(8, "DPL302")],
    ),
    "a hasattr in a statement, in an elif, and at module level": (
        """
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = nn.DataParallel(Net())
        if hasattr(net, "reset"):
            net.reset()

        def step(model, args):
            if args.distributed:
                model = DDP(model)
            use_head = hasattr(model, "head")
            if args.freeze:
                pass
            elif hasattr(model, "backbone"):
                model.backbone.train()
            return use_head
        """,
        [(4, "DPL302"), (10, "DPL302"), (13, "DPL302")],
    ),
    "the standard unwrapping test and the wrapper's own attributes are silent": (
        """
        import torch.nn as nn
        model = nn.DataParallel(model)
        if hasattr(model, "module"):
            inner = model.module
        if hasattr(model, "no_sync") or hasattr(model, "parameters") or hasattr(model, "device_ids"):
            pass
        plain = model.module if hasattr(model, "module") else model
        has_encoder = hasattr(plain, "encoder")
        """,
        [],
    ),
    "a test whose fallback reaches `.module` tells the cases apart": (
        """
        import torch.nn as nn

        def encoder_of(model, args):
            if args.multi_gpu:
                model = nn.DataParallel(model)
            if hasattr(model, "encoder"):
                return model.encoder
            else:
                return model.module.encoder

        def decoder_of(model):
            model = nn.DataParallel(model)
            return model.decoder if hasattr(model, "decoder") else model.module.decoder
        """,
        [],
    ),
    "the branch where the name is not wrapped, and an attribute set on the wrapper": (
        """
        import torch.nn as nn

        def run(model, args):
            if args.ngpu > 1:
                model = nn.DataParallel(model)
            else:
                if hasattr(model, "encoder"):
                    model.encoder.eval()
            model.log_every = 10
            if hasattr(model, "log_every"):
                print(model.log_every)
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL302_HASATTR_CASES.values(), ids=DPL302_HASATTR_CASES.keys())
def test_wrapper_hasattr(source, expected):
    assert findings(source, ["DPL302"]) == expected


def test_wrapper_hasattr_message():
    source = """
    import torch.nn as nn
    model = nn.DataParallel(model)
    if hasattr(model, "encoder"):
        model.encoder.eval()
    """
    [finding] = lint_source(textwrap.dedent(source).lstrip("\n"), "case.py", select=["DPL302"])
    assert finding.message == (
        "`hasattr(model, 'encoder')` is always False on the DataParallel wrapper (line 2)."
    )
    assert finding.help == (
        "The wrapper keeps the model's attributes on `model.module`: test `hasattr(getattr(model, \"module\", model), 'encoder')`."
    )


DPL513_NAME_CASES = {
    "a seed built from the rank earlier in the function": (
        """
        import os
        import torch.distributed as dist
        from torch.utils.data import DistributedSampler

        def loaders(args, train_set, val_set):
            seed = args.seed + dist.get_rank()
            rank = int(os.environ["RANK"])
            base = args.seed * rank
            return DistributedSampler(train_set, seed=seed), DistributedSampler(val_set, seed=base)
        """,
        [(9, "DPL513"), (9, "DPL513")],
    ),
    "a seed the same on every rank, or a parameter, is silent": (
        """
        import torch
        import torch.distributed as dist
        from torch.utils.data import DistributedSampler

        def loaders(args, dataset, epoch, seed):
            shared = args.seed
            per_epoch = 42 + epoch
            torch.manual_seed(args.seed + dist.get_rank())
            return [DistributedSampler(dataset, seed=s) for s in (shared, per_epoch)], DistributedSampler(dataset, seed=seed)
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL513_NAME_CASES.values(), ids=DPL513_NAME_CASES.keys())
def test_sampler_seed_through_a_name(source, expected):
    assert findings(source, ["DPL513"]) == expected


# Accelerate: `accelerator.prepare` hands a module back wrapped in DDP when the script runs in several
# processes (accelerate 1.15's `prepare_model`); a model `Net` of the file, an optimizer beside it.
ACCELERATE_HEAD = """\
import torch
import torch.nn as nn
from accelerate import Accelerator


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def embed(self, x):
        return self.fc(x)

"""

DPL302_ACCELERATE_CASES = {
    "a prepared model read in its function, an optimizer prepared with it is no module": (
        """
        def main(loader):
            accelerator = Accelerator()
            model = Net()
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for x in loader:
                accelerator.backward(model(x).sum())
                optimizer.step()
            return model.embed(x)
        """,
        [(22, "DPL302")],
    ),
    "a trainer's `self.model` prepared in `__init__` and read in another method": (
        """
        class Trainer:
            def __init__(self):
                self.accelerator = Accelerator(mixed_precision="fp16")
                self.model = Net()
                self.optimizer = torch.optim.AdamW(self.model.parameters())
                self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)

            def evaluate(self, x):
                self.model.eval()
                self.optimizer.zero_grad()
                return self.model.embed(x)
        """,
        [(24, "DPL302")],
    ),
    "`prepare_model` wraps too": (
        """
        accelerator = Accelerator()
        model = accelerator.prepare_model(Net())
        model.fc.reset_parameters()
        """,
        [(16, "DPL302")],
    ),
    "unwrapped by the Accelerator, or by getattr": (
        """
        accelerator = Accelerator()
        model = accelerator.prepare(Net())
        accelerator.unwrap_model(model).embed(x)
        plain = accelerator.unwrap_model(model)
        plain.embed(x)
        getattr(model, "module", model).embed(x)
        model = accelerator.unwrap_model(model)
        model.embed(x)
        """,
        [],
    ),
    "the wrapper's own attributes, and `.module` itself": (
        """
        accelerator = Accelerator()
        model = accelerator.prepare(Net())
        model.train()
        params = list(model.parameters())
        with model.no_sync():
            print(model.training, model.device, model.module.fc)
        torch.save(model.state_dict(), "m.pt")
        """,
        [],
    ),
    "a DeepSpeed plugin: the engine forwards attribute reads to the model": (
        """
        from accelerate.utils import DeepSpeedPlugin
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1))
        model = accelerator.prepare(Net())
        model.embed(x)
        """,
        [],
    ),
    "an FSDP plugin: FSDP forwards attribute reads to the model": (
        """
        from accelerate import FullyShardedDataParallelPlugin
        plugin = FullyShardedDataParallelPlugin()
        accelerator = Accelerator(fsdp_plugin=plugin)
        model = accelerator.prepare(Net())
        model.embed(x)
        """,
        [],
    ),
    "a frozen model, and one prepared for evaluation only, are not wrapped": (
        """
        accelerator = Accelerator()
        teacher = Net()
        teacher.requires_grad_(False)
        teacher = accelerator.prepare(teacher)
        teacher.embed(x)
        ema = accelerator.prepare_model(Net(), evaluation_mode=True)
        ema.embed(x)
        """,
        [],
    ),
    "what the file does not show is a module, and an Accelerator built elsewhere, stay unknown": (
        """
        from transformers import AutoModel

        def main(accelerator, net):
            net = accelerator.prepare(net)
            net.embed(x)

        accelerator = Accelerator()
        model = accelerator.prepare(AutoModel.from_pretrained("bert-base-uncased"))
        model.generate(x)
        """,
        [],
    ),
    "an object with a `prepare` method that is no Accelerator": (
        """
        model = processor.prepare(Net())
        model.embed(x)
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL302_ACCELERATE_CASES.values(), ids=DPL302_ACCELERATE_CASES.keys())
def test_wrapper_attribute_access_on_a_prepared_model(source, expected):
    assert findings(ACCELERATE_HEAD + textwrap.dedent(source).lstrip("\n"), ["DPL302"]) == expected


def test_a_prepared_model_s_message_and_help_name_the_accelerator():
    source = ACCELERATE_HEAD + "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(Net(), opt)\nmodel.embed(x)\n"
    [finding] = lint_source(source, "case.py", select=["DPL302"])
    assert finding.message == "`model` may be the DistributedDataParallel wrapper (`accelerator.prepare()`, line 15), which has no `embed`."
    assert finding.help == "Use `accelerator.unwrap_model(model).embed`."
    assert finding.fix is None  # `model.module` raises in a run of one process, where nothing is wrapped


def test_a_prepared_model_s_state_dict_saved_has_the_prefix():
    source = ACCELERATE_HEAD + textwrap.dedent(
        """
        accelerator = Accelerator()
        model, optimizer = accelerator.prepare(Net(), optimizer)
        accelerator.save(model.state_dict(), "model.pt")
        accelerator.save(optimizer.state_dict(), "optimizer.pt")
        accelerator.save(accelerator.get_state_dict(model), "model.pt")
        torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
        accelerator.save_model(model, "out")
        """
    ).lstrip("\n")
    [finding] = lint_source(source, "case.py", select=["DPL312"])
    assert (finding.location.row, finding.code) == (16, "DPL312")
    assert finding.help.startswith("Save `accelerator.unwrap_model(model).state_dict()`, the plain model's keys")


DPL303_CASES = {
    "the state_dict call is reported, not torch.save, also through a variable and a dict": (
        """
        import torch
        import torch.nn as nn
        model = nn.DataParallel(model).cuda()
        torch.save(
            model.state_dict(),
            "a.pt",
        )
        state = {"net": model.state_dict(), "epoch": 3}
        torch.save(state, "b.pt")
        """,
        [(5, "DPL312"), (8, "DPL312")],
    ),
    "a save is DPL303 where a load of the project reads it into the bare model": (
        """
        import torch
        import torch.nn as nn
        model = nn.DataParallel(Net()).cuda()
        torch.save(model.state_dict(), "a.pt")
        plain = Net()
        plain.load_state_dict(torch.load("a.pt"))
        """,
        [(4, "DPL303")],
    ),
    "a state_dict kept in memory is not a checkpoint": (
        """
        import copy
        import torch.nn as nn
        model = nn.DataParallel(model)
        best = copy.deepcopy(model.state_dict())
        model.load_state_dict(best)
        """,
        [],
    ),
    "the save on the branch that matches the wrap's condition is handled": (
        """
        import torch
        import torch.nn as nn
        if ngpu > 1:
            model = nn.DataParallel(model)
        torch.save(model.state_dict() if ngpu == 1 else model.module.state_dict(), "a.pt")
        if ngpu == 1:
            torch.save(model.state_dict(), "b.pt")
        if hasattr(model, "module"):
            torch.save(model.module.state_dict(), "c.pt")
        else:
            torch.save(model.state_dict(), "c.pt")
        """,
        [],
    ),
    "a save helper of a base trainer whose wrap is in __init__": (
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Trainer:
            def __init__(self, model, distributed):
                self.model = model
                if distributed:
                    self.model = DDP(self.model, device_ids=[0])

            def checkpoint(self, path):
                self.save_checkpoint({"model": self.model.state_dict()}, path)
        """,
        [(10, "DPL312")],
    ),
    "FSDP keys carry no prefix": (
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
        torch.save(model.state_dict(), "a.pt")
        """,
        [],
    ),
    "every common way of stripping the prefix by hand; a guarded strip is correct": (
        """
        import torch
        from collections import OrderedDict
        state = torch.load(args.checkpoint)["state_dict"]
        a = {k[7:]: v for k, v in state.items()}
        b = {k[len("module."):]: v for k, v in state.items()}
        c = OrderedDict((k.split("module.", 1)[-1], v) for k, v in state.items())
        d = {k.lstrip("module."): v for k, v in state.items()}
        new_state = OrderedDict()
        for k, v in state.items():
            if k.startswith("module."):
                k = k[7:]
            new_state[k] = v
        e = {k.replace("modules.", ""): v for k, v in state.items()}
        f = {(k[7:] if k.startswith("modules.") else k): v for k, v in state.items()}
        g = {(k[7:] if k[:7] == "module." else k): v for k, v in state.items()}
        h = {k[7:]: v for k, v in state.items() if k[7:] in model.state_dict()}
        i = {k[7:]: v for k, v in state.items() if len(k[7:]) > 0}
        """,
        [(4, "DPL303"), (5, "DPL303"), (7, "DPL303"), (13, "DPL303"), (14, "DPL303"), (17, "DPL303")],
    ),
    "split and replace cut only where a key holds `module.` further in: a submodule named so": (
        """
        import torch
        import torch.nn as nn
        state = torch.load(args.checkpoint)["state_dict"]
        a = {k.split("module.", 1)[-1]: v for k, v in state.items()}
        b = {k.replace("module.", ""): v for k, v in state.items()}

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.submodule = nn.Linear(4, 4)
        """,
        [(4, "DPL303"), (5, "DPL303")],
    ),
    "a strip of a checkpoint named in the code, or of one tested for the prefix, is left alone": (
        """
        import torch
        from collections import OrderedDict

        def released(net):
            state = torch.load("resnet50_imagenet_dp.pth")["state_dict"]
            net.load_state_dict({k[7:]: v for k, v in state.items()})

        def checked(path):
            state = torch.load(path)
            if not next(iter(state)).startswith("module."):
                return state
            return {k[7:]: v for k, v in state.items()}
        """,
        [],
    ),
    "a module-level wrapper a function reads when the module calls it": (
        """
        import torch
        import torch.nn as nn

        net = Net()
        if torch.cuda.is_available():
            net = nn.DataParallel(net)

        def test(epoch):
            global best
            torch.save({"net": net.state_dict(), "epoch": epoch}, "ckpt.pth")

        for epoch in range(3):
            test(epoch)
        """,
        [(10, "DPL312")],
    ),
    "a module-level name a function binds itself, reads before the wrap, or that has other callers": (
        """
        import torch
        import torch.nn as nn

        net = Net()

        def export(net):
            torch.save(net.state_dict(), "plain.pt")

        def early():
            torch.save(net.state_dict(), "early.pt")

        def callback():
            torch.save(net.state_dict(), "hook.pt")

        def rebinds():
            net = Net()
            torch.save(net.state_dict(), "own.pt")

        early()
        net = nn.DataParallel(net)
        export(net.module)
        callback()
        register(callback)
        rebinds()
        """,
        [],
    ),
    "a parameter every call passes a wrapper (possibly) holds one": (
        """
        import torch
        import torch.nn as nn

        def save(model, path):
            torch.save(model.state_dict(), path)

        def main(args):
            model = Net()
            if args.ngpu > 1:
                model = nn.DataParallel(model)
            save(model, "a.pt")
            save(path="b.pt", model=model.cuda())
        """,
        [(5, "DPL312")],
    ),
    "a parameter some call passes a plain model, or that is copied on the other branch of the wrap's test": (
        """
        import torch
        import torch.nn as nn

        def save(model, path):
            torch.save(model.state_dict(), path)

        def train(conf, generator):
            if conf.distributed:
                g_module = generator.module
            else:
                g_module = generator
            torch.save({"g": g_module.state_dict()}, "g.pt")

        def main(conf):
            net = Net()
            save(nn.DataParallel(net), "a.pt")
            save(net, "b.pt")
            generator = Net()
            if conf.distributed:
                generator = nn.parallel.DistributedDataParallel(generator)
            train(conf, generator)
        """,
        [],
    ),
    "slices and replacements outside a state dict's keys are not stripping": (
        """
        header = line[7:]
        title = name.replace("module", "")
        clean = state.removeprefix("module.")
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL303_CASES.values(), ids=DPL303_CASES.keys())
def test_wrapper_state_dict_prefix(source, expected):
    # DPL312 is the advice half of the save check: a save no load in view breaks on.
    assert findings(source, ["DPL303", "DPL312"]) == expected


def test_state_dict_message_says_only_what_the_path_shows():
    source = """
    import torch
    import torch.nn as nn
    if args.multi_gpu:
        model = nn.DataParallel(model)
    torch.save(model.state_dict(), "a.pt")
    net = nn.DataParallel(net)
    torch.save(net.state_dict(), "b.pt")
    """
    first, second = lint_source(textwrap.dedent(source).lstrip("\n"), "case.py", select=["DPL312"])
    assert first.message == "`model.state_dict()` may save `module.` keys (DataParallel on line 4 if `args.multi_gpu`)."
    assert second.message == "`net.state_dict()` saves `module.` keys (DataParallel on line 6)."
    assert (first.location.row, first.location.column) == (5, 12)


def test_a_save_that_a_load_breaks_on_names_the_load():
    source = """
    import torch
    import torch.nn as nn
    model = nn.DataParallel(Net())
    torch.save(model.state_dict(), "a.pt")
    demo = Net()
    demo.load_state_dict(torch.load("a.pt"))
    """
    [finding] = lint_source(textwrap.dedent(source).lstrip("\n"), "case.py", select=["DPL303", "DPL312"])
    assert finding.code == "DPL303"
    assert finding.message == "`model.state_dict()` saves `module.` keys (DataParallel, line 3), which case.py:6 loads into a bare `Net`."
    assert finding.help.startswith("Save `getattr(model, \"module\", model).state_dict()`") and "load such checkpoints into" in finding.help


def test_a_load_that_copes_or_loads_no_model_is_not_the_breaking_load():
    saved = """
    import torch
    import torch.nn as nn
    model = nn.DataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.save({"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, "a.pt")
    checkpoint = torch.load("a.pt")
    {load}
    """
    # An optimizer's `load_state_dict` reads no module keys; a loader that drops the first dotted part copes.
    for load in ('optimizer.load_state_dict(checkpoint["optimizer"])',
                 'Net().load_state_dict({".".join(k.split(".")[1:]): v for k, v in checkpoint["state_dict"].items()})'):
        assert [f.code for f in lint_source(textwrap.dedent(saved.replace("{load}", load)).lstrip("\n"), "case.py", select=["DPL303"])] == []
    # A bare model loading the keys as saved breaks.
    found = lint_source(textwrap.dedent(saved.replace("{load}", 'Net().load_state_dict(checkpoint["state_dict"])')).lstrip("\n"), "case.py", select=["DPL303"])
    assert [(f.location.row, f.code) for f in found] == [(5, "DPL303")]


DPL304_CASES = {
    "a scratch attribute reset at every call and read only in forward is harmless": (
        """
        import torch.nn as nn
        class Decoder(nn.Module):
            def forward(self, x):
                self.batch = x.size(0)
                self.hidden = self.init_hidden(self.batch)
                return self.rnn(x, self.hidden)
        model = nn.DataParallel(Decoder())
        """,
        [],
    ),
    "a counter builds on its old value": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                self.n = self.n + 1
                self.calls += 1
                return x
        model = nn.DataParallel(Net())
        """,
        [(4, "DPL304"), (5, "DPL304")],
    ),
    "an attribute read in another method, or through the wrapped model, outlives the call": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                self.attention = x.softmax(-1)
                self.features = x
                return x
            def visualise(self):
                return self.attention
        model = nn.DataParallel(Net())
        out = model(batch)
        print(model.module.features.shape)
        """,
        [(4, "DPL304"), (5, "DPL304")],
    ),
    "the same attribute name on an unrelated object is not a read of the model's": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                self.batch_size = x.size(0)
                return x.view(self.batch_size, -1)
        model = nn.DataParallel(Net())
        loader = make_loader(args.batch_size)
        """,
        [],
    ),
    "nothing after return": (
        """
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                if x is None:
                    return x
                    self.calls += 1
                return x
        model = nn.DataParallel(Net())
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL304_CASES.values(), ids=DPL304_CASES.keys())
def test_forward_mutates_module_state(source, expected):
    assert findings(source, ["DPL304"]) == expected


DPL401_CASES = {
    "every reduction without dim is 0-dim, directly or through a variable": (
        """
        def log_metrics(log, pred, target, grads):
            correct = (pred == target).float().sum()
            log("acc", correct.data[0], "max", grads.max().data[0], "min", grads.min().data[0])
            log("mean", pred.mean().data[0])
        """,
        [(3, "DPL401"), (3, "DPL401"), (3, "DPL401"), (4, "DPL401")],
    ),
    "reductions over a dim return vectors or tuples": (
        """
        def log_metrics(log, pred):
            log(pred.max(1)[0].data[0], pred.sum(dim=0).data[0], pred.mean(0).data[0])
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DPL401_CASES.values(), ids=DPL401_CASES.keys())
def test_loss_data_index(source, expected):
    assert findings(source, ["DPL401"]) == expected


def test_loss_data_index_fixes_every_use_on_a_line_or_none():
    source = textwrap.dedent(
        """
        import torch.nn as nn
        criterion = nn.CrossEntropyLoss()
        loss = criterion(out, y)
        print(loss.data[0], out.max().data[0])
        print(loss.data[0], scores.data[0])
        """
    ).lstrip("\n")
    result = lint_source(source, "case.py", select=["DPL401"])
    assert [(f.location.row, f.fix is not None) for f in result] == [(4, True), (4, True), (5, False)]
    fixed, applied = apply_fixes(source, result)
    assert "print(loss.item(), out.max().item())" in fixed
    assert "print(loss.data[0], scores.data[0])" in fixed and len(applied) == 2


DPL402_CASES = {
    "no graph under no_grad, inference_mode or set_grad_enabled(False)": (
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            with torch.no_grad():
                total += loss
            with torch.inference_mode():
                other += loss
            with torch.set_grad_enabled(False):
                third += loss
        """,
        [],
    ),
    "a decorated function records no graph": (
        """
        import torch
        @torch.inference_mode()
        def run(loader):
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss
            return total
        """,
        [],
    ),
    "the accumulation outside the no_grad block is still reported": (
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            with torch.no_grad():
                acc = accuracy(model(x), y)
            total += loss
        """,
        [(7, "DPL402")],
    ),
}


DPL402_CASES.update(
    {
        "the loss is graph-free on every path that reaches the addition": (
            """
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                if log_as_tensor:
                    loss = loss.detach()
                else:
                    loss = float(loss)
                total += loss
            """,
            [],
        ),
        "a reset on one path only still lets the sum grow": (
            """
            total = 0
            for step, (x, y) in enumerate(loader):
                if step % 100 == 0:
                    total = 0
                loss = criterion(model(x), y)
                loss.backward()
                total += loss
            """,
            [(7, "DPL402")],
        ),
        "a reset every iteration with `total = total + loss`": (
            """
            for x, y in loader:
                total = 0.0
                loss = criterion(model(x), y)
                loss.backward()
                total = total + loss
                report(total)
            """,
            [],
        ),
        "an accumulator of an enclosing scope is unknown and still reported": (
            """
            total = 0
            def train(loader):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    total = 0
                    global_total += loss
            """,
            [(7, "DPL402")],
        ),
    }
)


@pytest.mark.parametrize("source, expected", DPL402_CASES.values(), ids=DPL402_CASES.keys())
def test_accumulated_loss_tensor(source, expected):
    assert findings(source, ["DPL402"]) == expected


def test_crnn_submodule_rnn_is_found_through_the_wrapped_model():
    source = """
    import torch.nn as nn
    class BidirectionalLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(8, 8, bidirectional=True)
        def forward(self, x):
            return self.rnn(x)[0]
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = BidirectionalLSTM()
        def forward(self, x):
            return self.inner(x)
    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.Sequential(Block())
        def forward(self, x):
            return self.rnn(x)
    model = nn.DataParallel(CRNN())
    """
    assert findings(source, ["DPL308"]) == [(7, "DPL308")]


MESSAGE_RULES = [rule for rule in CHECKS if rule.code != "DPL101"]


@pytest.mark.parametrize("rule", MESSAGE_RULES, ids=lambda rule: rule.code)
def test_messages_are_one_short_sentence_and_help_is_separate(rule):
    for example in rule.INVALID:
        for finding in lint_source(example.source, "example.py", select=[rule.code]):
            # About 100 characters; quoted code and a wrap's condition may add a little.
            assert len(finding.message) <= 120, finding.message
            assert finding.message.endswith(".") and finding.message.count(". ") == 0, finding.message
            assert finding.help and finding.help not in finding.message


def test_the_tensor_api_table_is_up_to_date_with_the_installed_torch():
    import importlib.util
    from pathlib import Path

    from dplint.analysis import tensor_api
    from dplint.analysis.torch_stubs import torch_folder, tensor_api_module

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the table is read from its stubs")
    installed = torch_folder()[1]
    if installed != tensor_api.TORCH_VERSION:
        # The table is generated from the torch CI pins; another torch may have other stubs.
        pytest.skip(f"the table is generated from torch {tensor_api.TORCH_VERSION}; this is torch {installed}")
    expected = tensor_api_module()
    assert Path(tensor_api.__file__).read_text() == expected, "regenerate: python -m dplint.analysis.torch_stubs dplint/analysis/tensor_api.py"


def test_tensor_only_methods_are_tensor_methods_and_none_a_module_has():
    from dplint.analysis import tensor_api
    from dplint.analysis.inference import MODULE_METHODS, TENSOR_ONLY_METHODS

    assert TENSOR_ONLY_METHODS <= tensor_api.TENSOR_METHODS
    assert not TENSOR_ONLY_METHODS & MODULE_METHODS


# ----- issue 19: wraps however they are written, DDP for DPL104 ------------------------------------------

WRAP_FORMS_CASES = {
    "DPL103: a returned wrap is checked as an assigned one": (
        """
        import torch.nn as nn
        def build(model):
            return nn.DataParallel(model.cuda(1), device_ids=[0, 1])
        """,
        [(3, "DPL103")],
    ),
    "DPL103: passed on, in a conditional expression, in a comprehension": (
        """
        import torch.nn as nn
        run(nn.DataParallel(model.cuda(1), device_ids=[0, 1]))
        m = nn.DataParallel(model.cuda(1), device_ids=[0, 1]) if multi else model
        ms = [nn.DataParallel(x.cuda(1), device_ids=[0, 1]) for x in models]
        """,
        [(2, "DPL103"), (3, "DPL103"), (4, "DPL103")],
    ),
    "DPL103: a comprehension's variable is not the scope's name of the same spelling": (
        """
        import torch.nn as nn
        net = Net().cuda(1)
        nets = [nn.DataParallel(net, device_ids=[0, 1]) for net in backbones]
        """,
        [],
    ),
    "DPL302/303: a function of the file that returns a wrapper makes its call sites hold one": (
        """
        import torch
        import torch.nn as nn
        def build():
            model = Net()
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model)
            return model
        model = build()
        model.fc
        torch.save(model.state_dict(), "m.pt")
        """,
        [(9, "DPL302"), (10, "DPL312")],
    ),
    "DPL302/303: a wrap that the function decides by its own parameter is each caller's, unknown here": (
        """
        import torch
        import torch.nn as nn
        def create_model(opt):
            model = Net()
            if opt.isTrain and len(opt.gpu_ids) > 1:
                model = nn.DataParallel(model, device_ids=opt.gpu_ids)
            return model
        model = create_model(test_options)
        model.inference(x)
        torch.save(model.state_dict(), "m.pt")
        """,
        [],
    ),
    "DPL302: a function that unwraps before returning returns the plain model": (
        """
        import torch.nn as nn
        def build(args):
            model = nn.DataParallel(Net())
            return model.module if hasattr(model, "module") else model
        def load(args):
            model = nn.DataParallel(Net())
            model = model.module
            return model
        build(args).fc
        load(args).fc
        m = load(args)
        m.fc
        """,
        [],
    ),
    "DPL302: `net = net.eval()` keeps the wrapper": (
        """
        import torch.nn as nn
        net = nn.DataParallel(Net())
        net = net.eval()
        net.fc
        """,
        [(4, "DPL302")],
    ),
    "DPL302/303: an instance whose __init__ wraps self.model": (
        """
        import torch
        import torch.nn as nn
        class Trainer:
            def __init__(self, model):
                self.model = nn.DataParallel(model)
        trainer = Trainer(Net())
        print(trainer.model.fc)
        torch.save(trainer.model.state_dict(), "x.pt")
        """,
        [(7, "DPL302"), (8, "DPL312")],
    ),
    "DPL302: a wrap made in another method is not assumed from outside": (
        """
        import torch.nn as nn
        class Trainer:
            def __init__(self, model):
                self.model = model
            def parallelize(self):
                self.model = nn.DataParallel(self.model)
        trainer = Trainer(Net())
        trainer.model.fc
        """,
        [],
    ),
    "DPL302: an element of a container of wrappers, by index or in a loop": (
        """
        import torch.nn as nn
        class Heads:
            def __init__(self, heads):
                self.heads = [nn.DataParallel(h) for h in heads]
            def weight(self, i):
                return self.heads[i].weight
            def biases(self):
                return [head.bias for head in self.heads]
        """,
        [(6, "DPL302")],
    ),
    "DPL302: a container with a plain element is not a container of wrappers": (
        """
        import torch.nn as nn
        heads = [nn.DataParallel(a), b]
        heads[1].weight
        for head in heads:
            head.bias
        """,
        [],
    ),
    "DPL302: a helper that wraps in DDP under its own test, called where no process group starts": (
        """
        import torch
        def select_device(model):
            if torch.distributed.is_initialized():
                model = torch.nn.parallel.DistributedDataParallel(model)
            return model
        model = select_device(model)
        model.extract_embedding(x)
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", WRAP_FORMS_CASES.values(), ids=WRAP_FORMS_CASES.keys())
def test_wraps_however_written(source, expected):
    assert findings(source, ["DPL103", "DPL302", "DPL303", "DPL312"]) == expected


DDP_FORWARD_CASES = {
    "DPL104 under DDP; the DataParallel rules stay silent": (
        """
        import torch
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Net(nn.Module):
            def forward(self, x):
                self.calls += 1
                y = x.transpose(0, 1) * torch.ones(1, device="cuda:0")
                return y.sum()
        model = DDP(Net().cuda(rank), device_ids=[rank])
        """,
        [(7, "DPL104")],
    ),
    "DDP: the current device and the input's device are each rank's own": (
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x * torch.ones(1, device=x.device) + torch.zeros(1).cuda()
        model = nn.parallel.DistributedDataParallel(Net().cuda(rank), device_ids=[rank])
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", DDP_FORWARD_CASES.values(), ids=DDP_FORWARD_CASES.keys())
def test_wrapped_forward_under_ddp(source, expected):
    assert findings(source, ["DPL104", "DPL301", "DPL304", "DPL305"]) == expected


STRIPPING_FORMS_CASES = {
    "the unbound `str.replace` and the first dotted part dropped, over a state dict's keys": (
        """
        import torch
        checkpoint = torch.load(args.checkpoint)
        a = {str.replace(k, "module.", ""): v for k, v in checkpoint["state_dict"].items()}
        b = {".".join(k.split(".")[1:]): v for k, v in checkpoint["state_dict"].items()}
        self.submodule = Block()  # keys with `submodule.` further in: `replace` cuts them
        """,
        [(3, "DPL303"), (4, "DPL303")],
    ),
    "dropping the first part of a dotted module path, or of a model's own keys, is no prefix stripping": (
        """
        import torch
        package = ".".join(name.split(".")[1:])
        names = {".".join(k.split(".")[1:]) for k in config.keys()}
        def transfer(model, weights):  # pytorch-openpose: the model's `model0.` keys matched to converted weights
            return {name: weights[".".join(name.split(".")[1:])] for name in model.state_dict().keys()}
        """,
        [],
    ),
    "dropping the first part of keys that start with another name is no prefix stripping (ConvNeXt-V2)": (
        """
        import torch
        ckpt = torch.load(args.finetune)["model"]
        new_ckpt = {}
        for k, v in ckpt.items():
            if k.startswith("encoder"):
                k = ".".join(k.split(".")[1:])
            new_ckpt[k] = v
        """,
        [],
    ),
    "each branch of an elif chain is guarded by its own test": (
        """
        import torch
        state_dict = torch.load(args.pretrained)["state_dict"]
        for k in list(state_dict.keys()):
            if k.startswith("module.encoder_q") and not k.startswith("module.encoder_q.fc"):
                state_dict[k[len("module.encoder_q."):]] = state_dict[k]
            elif k.startswith("module") and not k.startswith("module.fc"):
                state_dict[k[len("module."):]] = state_dict[k]
            del state_dict[k]
        """,
        [],
    ),
}


@pytest.mark.parametrize("source, expected", STRIPPING_FORMS_CASES.values(), ids=STRIPPING_FORMS_CASES.keys())
def test_prefix_stripping_forms(source, expected):
    assert findings(source, ["DPL303"]) == expected


def test_batch_moved_in_a_helper_on_one_branch():
    source = """
    import torch.nn as nn
    class Net(nn.Module):
        def to_sequence(self, x):
            if self.flat:
                b, c, h, w = x.size()
                return x.view(b, c * h, w).permute(2, 0, 1)
            return x.mean(2)
        def forward(self, images):
            return self.to_sequence(images)
    model = nn.DataParallel(Net())
    """
    assert findings(source, ["DPL301"]) == [(6, "DPL301")]
