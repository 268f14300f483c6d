"""``--kv-events-config``: vLLM's JSON keys and defaults, from the flag or its environment."""

import pytest

from kvserve.engine.kv_events import KVEventsConfig
from kvserve.server.cli import build_parser, engine_config


def test_the_json_takes_vllm_keys_and_defaults():
    config = KVEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://epp:5557", "topic": "kv@p@m",'
        ' "replay_endpoint": "tcp://*:5558", "buffer_steps": 5, "hwm": 7, "max_queue_size": 9}'
    )
    assert config == KVEventsConfig(
        True, "zmq", "tcp://epp:5557", "tcp://*:5558", 5, 7, 9, "kv@p@m"
    )
    assert config.enabled
    assert KVEventsConfig() == KVEventsConfig(False, "null", "tcp://*:5557", None, 10_000, 100_000)
    assert not KVEventsConfig().enabled
    assert not KVEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "publisher": "null"}'
    ).enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "kv_events_config is not JSON"),
        ("[]", "kv_events_config must be a JSON object"),
        ('{"topc": "kv@a@b"}', "kv_events_config has unknown keys: topc"),
        (
            '{"enable_kv_cache_events": "yes"}',
            "enable_kv_cache_events must be true or false: 'yes'",
        ),
        ('{"hwm": true}', "kv_events_config.hwm must be an integer: True"),
        ('{"publisher": "nats"}', "kv_events_config.publisher must be null or zmq: 'nats'"),
        ('{"endpoint": "http://x:1"}', "kv_events_config.endpoint must start with tcp://"),
        ('{"max_queue_size": 0}', "kv_events_config.max_queue_size is too small: 0"),
    ],
)
def test_a_bad_config_is_refused_by_name(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        KVEventsConfig.from_json(text)


def test_the_flag_beats_its_environment_variable_and_is_off_by_default(monkeypatch, capsys):
    assert engine_config(build_parser().parse_args(["serve"])).kv_events_config is None
    monkeypatch.setenv("KVSERVE_KV_EVENTS_CONFIG", '{"enable_kv_cache_events": true}')
    from_env = engine_config(build_parser().parse_args(["serve"])).kv_events_config
    assert from_env == KVEventsConfig(enable_kv_cache_events=True)
    args = build_parser().parse_args(["serve", "--kv-events-config", '{"topic": "kv@p@m"}'])
    assert engine_config(args).kv_events_config == KVEventsConfig(topic="kv@p@m")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-events-config", '{"topc": 1}'])
    assert "argument --kv-events-config: kv_events_config has unknown keys: topc" in (
        capsys.readouterr().err
    )
