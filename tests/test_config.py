"""Config loading: YAML overrides, dotted CLI overrides, clear errors naming key and file, save."""
import json
import os

import pytest
import yaml

from d3mini.config import Config, ConfigError, from_dict, load_config, save_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_yaml_and_cli_overrides(tmp_path):
    p = write(tmp_path, "rl: {lr: 1.0e-5, algo: espo}\nmodel: {family: llada}\n")
    c = load_config(p, ["--rl.lr", "1e-6", "decode.threshold=0.9", "train.stages=[sft]", "--env.data_dir", "/x"])
    assert c.rl.lr == 1e-6 and c.rl.algo == "espo" and c.model.family == "llada"
    assert c.decode.threshold == 0.9 and c.train.stages == ["sft"] and c.env.data_dir == "/x"
    assert Config().rl.lr != 1e-6  # defaults untouched


@pytest.mark.parametrize("text,match", [
    ("rl: {lrr: 1}\n", r"c\.yaml: unknown key 'rl\.lrr'"),
    ("nosuch: {a: 1}\n", r"unknown key 'nosuch'"),
    ("rl: {lr: fast}\n", r"c\.yaml: rl\.lr: expected a number"),
    ("rl: {steps: 1.5}\n", r"rl\.steps: expected an integer"),
    ("rl: {algo: ppo9}\n", r"rl\.algo = 'ppo9': must be one of"),
    ("decode: {threshold: 1.5}\n", r"decode\.threshold"),
    ("rl: {threshold: -0.1}\n", r"rl\.threshold = -0\.1: must be in \[0, 1\]"),
    ("distill: {threshold: 2}\n", r"distill\.threshold = 2\.0: must be in \[0, 1\]"),
    ("rl: {step_advantage: gigpo}\n", r"rl\.step_advantage = 'gigpo': must be one of"),
    ("distill: {gate_on: think}\n", r"distill\.gate_on = 'think': must be one of"),
    ("rl: {gamma: 1.5}\n", r"rl\.gamma = 1\.5: must be in \[0, 1\]"),
    ("sft: {detours: 1.2}\n", r"sft\.detours = 1\.2: must be in \[0, 1\]"),
    ("sft: {steps: 100, dagger_at: [50, 20]}\n", r"sft\.dagger_at = \[50, 20\]: must be increasing integer steps"),
    ("sft: {steps: 100, dagger_at: [100]}\n", r"sft\.dagger_at = \[100\]: .*\[0, sft\.steps = 100\)"),
    ("sft: {dagger_at: [1.5]}\n", r"sft\.dagger_at"),
    ("sft: {dagger_tasks: 0}\n", r"sft\.dagger_tasks = 0: must be > 0"),
    ("sft: {dagger_threshold: 1.1}\n", r"sft\.dagger_threshold = 1\.1: must be in \[0, 1\]"),
    ("rl: {step_weight: -1}\n", r"rl\.step_weight = -1\.0: must be >= 0"),
    ("rl: {neg_weight: -0.5}\n", r"rl\.neg_weight = -0\.5: must be >= 0"),
    ("model: {num_heads: 4, num_kv_heads: 3}\n", r"model\.num_kv_heads.*divide"),
    ("model: {mask_id: 2}\n", r"model\.mask_id"),
    ("train: {stages: [sft, pretrain]}\n", r"unknown stage 'pretrain'"),
    ("rl: [1, 2]\n", r"rl: expected a mapping"),
    ("rl: {lr: [\n", r"not valid YAML"),
    ("sft: {lr: -1}\n", r"sft\.lr = -1\.0: must be >= 0"),
    ("rl: {lr: .inf}\n", r"rl\.lr = inf: must be finite"),
    ("distill: {lr: .nan}\n", r"distill\.lr = nan: is not a number"),
    ("decode: {top_p: .nan}\n", r"decode\.top_p = nan: is not a number"),
    ("train: {save_every: 0}\n", r"train\.save_every = 0: must be > 0"),
    ("train: {betas: [0.9, 1.5]}\n", r"train\.betas .*two numbers in \[0, 1\)"),
    ("train: {betas: [0.9]}\n", r"train\.betas"),
])
def test_errors_name_key_and_file(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text))


def test_cli_errors():
    with pytest.raises(ConfigError, match=r"cli: unknown key 'rl\.nope'"):
        load_config(None, ["rl.nope=1"])
    with pytest.raises(ConfigError, match=r"--rl\.lr needs a value"):
        load_config(None, ["--rl.lr"])
    with pytest.raises(ConfigError, match="cannot parse override"):
        load_config(None, ["rl.lr"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent.yaml")
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found \(configs/ has .*tiny\.yaml"):
        load_config("nope.yaml")


def test_a_bare_config_name_is_found_in_configs(tmp_path, monkeypatch):
    """`train.py --config webshop.yaml` (the documented command) from any folder: a bare name that is not a file
    there is the project's configs/ file, with or without .yaml; a file of that name where the command runs wins."""
    monkeypatch.chdir(tmp_path)
    assert load_config("webshop.yaml") == load_config(os.path.join(ROOT, "configs", "webshop.yaml"))
    assert load_config("tiny").model.hidden_size == load_config(os.path.join(ROOT, "configs", "tiny.yaml")).model.hidden_size
    (tmp_path / "webshop.yaml").write_text("model:\n  hidden_size: 96\n")
    assert load_config("webshop.yaml").model.hidden_size == 96


def test_unreadable_config_files(tmp_path):
    """A folder or a binary file as --config: a ConfigError naming it, not a traceback."""
    with pytest.raises(ConfigError, match=f"{tmp_path}: cannot read the config"):
        load_config(str(tmp_path))
    binary = tmp_path / "weights.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="weights.yaml: (cannot read the config|not valid YAML)"):
        load_config(str(binary))


def test_save_roundtrip(tmp_path):
    c = load_config(None, ["rl.kl=k3", "model.block_size=8", "decode.block_size=8"])
    for name in ("c.yaml", "c.json"):
        save_config(c, str(tmp_path / name))
        data = yaml.safe_load(open(tmp_path / name)) if name.endswith("yaml") else json.load(open(tmp_path / name))
        assert from_dict(data) == c


def test_shipped_configs_load():
    for f in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        c = load_config(os.path.join(ROOT, "configs", f))
        if c.model.family == "sdar":
            assert c.decode.block_size == c.model.block_size
