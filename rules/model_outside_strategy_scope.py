from __future__ import annotations

import re
from typing import Iterator, Optional, Set

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.names import Body, block_body, child_blocks, iter_calls
from dplint.rule import Invalid, Report, Rule, Valid

KERAS_MODELS = frozenset({"Sequential", "Model"})
KERAS_PACKAGES = ("tensorflow.keras", "keras", "tf_keras")


class ModelOutsideStrategyScope(Rule):
    """
    ## What it does
    In TensorFlow code that creates a `tf.distribute` strategy (`MirroredStrategy`, `TPUStrategy`,
    `MultiWorkerMirroredStrategy`, …), reports Keras models built (`tf.keras.Sequential(...)`,
    `tf.keras.Model(...)`, `tf.keras.applications.ResNet50(...)`) outside `with strategy.scope():`,
    directly or in a function that is never called from inside such a block.

    ## Why is this bad?
    Variables are mirrored across devices (or placed on the TPU) only when they are created inside
    the strategy's scope. A model built outside it lives on one device: training runs there alone,
    or `fit` fails with "Trying to create optimizer slot variable under the scope for
    tf.distribute.Strategy, which is different from the scope used for the original variable".

    ## Example
    ```python
    strategy = tf.distribute.MirroredStrategy()
    model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss="mse")
    ```

    ## Use instead
    ```python
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="mse")
    ```

    ## Known problems
    A model-building function counts as inside the scope when the file calls it by name within a
    `with ….scope():` block; calls through other modules are not followed.
    """

    code = "DPL601"
    name = "model-outside-strategy-scope"
    summary = "A Keras model is built outside `with strategy.scope():`, so its variables are not distributed."
    triggers = re.compile(r"distribute\.(?:\w+\.)*\w*Strategy\(")

    VALID = [
        Valid(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
            """
        ),
        Valid(
            """
            import tensorflow as tf

            def build():
                return tf.keras.Sequential([tf.keras.layers.Dense(10)])

            strategy = tf.distribute.TPUStrategy(resolver)
            with strategy.scope():
                model = build()
            """
        ),
        Valid(
            """
            import tensorflow as tf
            model = tf.keras.Sequential([tf.keras.layers.Dense(10)])  # no strategy in this file
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
            """,
            line=3,
        ),
        Invalid(
            """
            import tensorflow as tf
            from tensorflow import keras

            def build():
                base = keras.applications.ResNet50(weights=None)
                return base

            strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
            model = build()
            with strategy.scope():
                model.compile(optimizer="adam", loss="mse")
            """,
            line=5,
        ),
        Invalid(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                optimizer = tf.keras.optimizers.Adam()
            inputs = tf.keras.Input(shape=(4,))
            model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))
            """,
            line=6,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        if not any(_is_strategy(ctx.qualify(call.func)) for call in iter_calls(ctx.module)):
            return
        in_scope = _functions_called_in_scope(ctx.module.body)
        yield from self._block(ctx, ctx.module.body, in_scope, inside=False)

    def _block(self, ctx: FileContext, body: Body, in_scope: Set[str], inside: bool) -> Iterator[Report]:
        for statement in body:
            if isinstance(statement, cst.FunctionDef):
                yield from self._block(ctx, block_body(statement.body), in_scope, inside or statement.name.value in in_scope)
            elif isinstance(statement, cst.With):
                scoped = inside or any(_is_scope_call(item.item) for item in statement.items)
                yield from self._block(ctx, block_body(statement.body), in_scope, scoped)
            elif isinstance(statement, cst.BaseCompoundStatement):
                for block in child_blocks(statement):
                    yield from self._block(ctx, block, in_scope, inside)
            elif not inside:
                for call in iter_calls(statement):
                    built = _keras_model(ctx.qualify(call.func))
                    if built is not None:
                        yield Report(
                            node=call,
                            message=(
                                f"`{ctx.short_code(call, 25)}` builds a Keras model outside `strategy.scope()`: its "
                                "variables are not mirrored."
                            ),
                            help="Build and compile the model inside `with strategy.scope():`.",
                            statement=statement,
                        )


def _is_strategy(qualified: Optional[str]) -> bool:
    return bool(qualified) and qualified.startswith("tensorflow.distribute.") and qualified.endswith("Strategy")  # type: ignore[union-attr]


def _keras_model(qualified: Optional[str]) -> Optional[str]:
    if not qualified:
        return None
    package, _, name = qualified.rpartition(".")
    for root in KERAS_PACKAGES:
        if package in (root, f"{root}.models") and name in KERAS_MODELS:
            return name
        if package.startswith(f"{root}.applications") and name[:1].isupper():
            return name
    return None


def _is_scope_call(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "scope"


def _functions_called_in_scope(body: Body) -> Set[str]:
    """Names of this file's functions called (by name) inside a `with ….scope():` block."""
    called: Set[str] = set()

    def walk(statements: Body, inside: bool) -> None:
        for statement in statements:
            if isinstance(statement, cst.With):
                walk(block_body(statement.body), inside or any(_is_scope_call(i.item) for i in statement.items))
            elif isinstance(statement, cst.BaseCompoundStatement):
                for block in child_blocks(statement):
                    walk(block, inside)
            elif inside:
                called.update(c.func.value for c in iter_calls(statement) if isinstance(c.func, cst.Name))

    walk(body, False)
    return called
