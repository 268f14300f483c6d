"""Property: for random JSON schemas from a bounded family (every value has a bounded
size, so a sampled output always fits ``max_tokens``), every output of the random tiny
model parses and validates."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve import LLM, SamplingParams
from kvserve.engine.structured.spec import OutputConstraint

NAMES = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.one_of(NAMES, st.integers(-50, 50)), min_size=1, max_size=4, unique=True).map(
        lambda values: {"enum": values}
    ),
    st.tuples(st.integers(-1000, 1000), st.integers(0, 1000)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}
    ),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.integers(1, 3).map(lambda n: {"type": "string", "minLength": n, "maxLength": n + 2}),
    st.just({"type": "string", "pattern": "^[a-c]{1,3}-[0-9]$"}),
    st.one_of(NAMES, st.booleans(), st.integers(-9, 9)).map(lambda value: {"const": value}),
)


def _objects(children):
    def build(draw_props):
        props, required = draw_props
        schema = {"type": "object", "properties": props, "additionalProperties": False}
        return schema | {"required": sorted(required & props.keys())}

    return st.tuples(
        st.dictionaries(NAMES, children, min_size=1, max_size=3), st.sets(NAMES, max_size=3)
    ).map(build)


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        _objects(children),
        st.tuples(children, st.integers(0, 3)).map(
            lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}
        ),
        st.lists(children, min_size=2, max_size=2).map(lambda pair: {"anyOf": pair}),
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint("llama")), num_kv_blocks=256)


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**32))
def test_every_output_validates(llm, schema, seed):
    constraint = OutputConstraint("json", json.dumps(schema))
    params = [
        SamplingParams(temperature=1.0, seed=seed + i, max_tokens=400, constraint=constraint)
        for i in range(2)
    ]
    for output in llm.generate(["{", "The answer:"], params):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), schema)
