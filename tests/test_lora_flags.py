"""``--lora-modules`` in vLLM's two spellings (and from ``KVSERVE_LORA_MODULES``), and
``vllm:lora_requests_info`` as vLLM labels it."""

import pytest

from kvserve.engine.core.scheduler import SchedulerStats
from kvserve.server.cli import build_parser
from kvserve.server.lora_modules import LoRAModule
from kvserve.server.metrics import ServerMetrics


def test_lora_modules_take_name_path_and_json(monkeypatch):
    args = build_parser().parse_args(
        [
            "serve",
            "--lora-modules",
            "a=/p/a",
            '{"name": "b", "path": "/p/b", "base_model_name": "m"}',
        ]
    )
    assert args.lora_modules == [LoRAModule("a", "/p/a"), LoRAModule("b", "/p/b", "m")]
    monkeypatch.setenv("KVSERVE_LORA_MODULES", "a=/p/a c=/p/c")
    monkeypatch.setenv("KVSERVE_ALLOW_RUNTIME_LORA_UPDATING", "1")
    args = build_parser().parse_args(["serve"])
    assert args.lora_modules == [LoRAModule("a", "/p/a"), LoRAModule("c", "/p/c")]
    assert args.allow_runtime_lora_updating is True


@pytest.mark.parametrize(
    "value",
    [
        'a=/p/a\n{"name": "b b", "path": "/p/b b", "base_model_name": "m"}\n c=/p/c',
        '  a=/p/a {"name": "b b", "path": "/p/b b", "base_model_name": "m"}\tc=/p/c\n',
        '["a=/p/a", {"name": "b b", "path": "/p/b b", "base_model_name": "m"}, "c=/p/c"]',
    ],
    ids=["lines", "spaces", "json-array"],
)
def test_lora_modules_from_the_environment_keep_json_objects_whole(monkeypatch, value):
    monkeypatch.setenv("KVSERVE_LORA_MODULES", value)
    assert build_parser().parse_args(["serve"]).lora_modules == [
        LoRAModule("a", "/p/a"),
        LoRAModule("b b", "/p/b b", "m"),
        LoRAModule("c", "/p/c"),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"name": "a", "path": "/p/a"', "KVSERVE_LORA_MODULES: invalid JSON object: Expecting"),
        ('{"name": "a", "path": "/p"}x', "no space after a JSON object"),
        ('["a=/p/a", 3]', "a JSON array of strings and objects"),
        ("[a=/p/a]", "KVSERVE_LORA_MODULES is not a JSON array"),
        ('{"name": "a"}', "KVSERVE_LORA_MODULES: --lora-modules "),
    ],
)
def test_a_bad_lora_modules_variable_stops_the_cli_naming_it(monkeypatch, value, message):
    monkeypatch.setenv("KVSERVE_LORA_MODULES", value)
    with pytest.raises(SystemExit) as stopped:
        build_parser()
    assert str(stopped.value.code).startswith("kvserve: ") and message in str(stopped.value.code)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a", "expected name=path or a JSON object"),
        ('{"name": "a"}', "name and path must be strings"),
        ('{"name": "a", "path": "/p", "extra": 1}', "keys must be name, path and base_model_name"),
        ("{nope", "invalid JSON"),
    ],
)
def test_a_bad_lora_module_stops_the_cli_naming_it(capsys, value, words):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lora-modules", value])
    assert words in capsys.readouterr().err


def test_lora_requests_info_names_the_running_and_waiting_adapters():
    metrics = ServerMetrics("m", max_lora=2)
    stats = SchedulerStats(running_lora_adapters=("a", "b"), waiting_lora_adapters=("c",))
    metrics.on_step(stats, [])
    samples = [s for f in metrics.registry.collect() for s in f.samples]
    info = [s for s in samples if s.name == "vllm:lora_requests_info"]
    assert [s.labels for s in info] == [
        {"max_lora": "2", "waiting_lora_adapters": "c", "running_lora_adapters": "a,b"}
    ]
    assert info[0].value > 1.7e9  # the time of the update, as vLLM sets it
    assert "vllm:lora_requests_info" not in {f.name for f in ServerMetrics("m").registry.collect()}
