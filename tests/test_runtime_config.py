"""Config validation: every error names the field and the fix, and the CLI exits 2 with one line per problem."""
import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import load_config
from tests.runtime_helpers import geodiloco, small_config, write_config

NODES = [{"name": "a", "emulate": {"step_time_s": 0.1}}, {"name": "b", "emulate": {"step_time_s": 0.2}}]


def load(tmp_path, config):
    return load_config(write_config(tmp_path, config))


def test_embedded_default_config_is_valid():
    config = load_config(None)
    assert len(config.nodes) >= 2
    assert config.optim.outer.lr == 0.7 and config.optim.outer.momentum == 0.9 and config.optim.outer.nesterov


def test_count_shorthand_expands_gpus(tmp_path):
    config = load(tmp_path, small_config([{"name": "a", "gpus": ["3 x RTX 2080 Ti", "Titan RTX"]}]))
    assert config.nodes[0].gpus == ["RTX 2080 Ti"] * 3 + ["Titan RTX"]
    assert config.nodes[0].site == "a"


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["diloco"].update(rounds=0), "diloco.rounds: Input should be greater than or equal to 1 (got 0)"),
    (lambda c: c["optim"]["inner"].update(lrr=1), "optim.inner.lrr: unknown key; did you mean 'lr'?"),
    (lambda c: c.update(extra_section={}), "extra_section: unknown key"),
    (lambda c: c["nodes"][1]["emulate"].update(gpu="A30"), "nodes[1].emulate: give exactly one of emulate.step_time_s"),
    (lambda c: c["nodes"][0]["emulate"].update(step_time_s=-1), "nodes[0].emulate.step_time_s: Input should be greater than 0"),
    (lambda c: c["nodes"].append({"name": "a"}), "names must be unique; nodes[0].name, nodes[2].name repeat 'a'"),
    (lambda c: c["diloco"].update(weighting="median"), "diloco.weighting: Input should be 'uniform', 'tokens', 'normalized' or 'auto'"),
    (lambda c: c["comm"].update(timeout_s=0), "comm.timeout_s: Input should be greater than 0"),
    (lambda c: c["comm"].update(sync_threads=0), "comm.sync_threads: Input should be greater than or equal to 1"),
    (lambda c: c["model"].update(preset="gpt5"), "model.preset: unknown model preset 'gpt5'; known presets: llama-150m, small, tiny"),
    (lambda c: c["model"].update(seq_len=4096), "model.seq_len: 4096 exceeds the model's max_seq_len 256"),
    (lambda c: c.update(nodes=[]), "nodes: the config lists no node; add one entry per site"),
    (lambda c: c["diloco"].update(overlap="async"), "diloco.overlap: Input should be 'none', 'delayed' or 'streaming'"),
    (lambda c: c["diloco"].update(fragments=0), "diloco.fragments: Input should be greater than or equal to 1"),
    (lambda c: c["diloco"].update(compression="int2"),
     "diloco.compression: Input should be 'none', 'fp16', 'bf16', 'int8' or 'int4'"),
    (lambda c: (c["diloco"].update(overlap="delayed"), c.update(comm={"backend": "hivemind"})),
     "diloco.overlap: delayed needs comm.backend: torch"),
    (lambda c: (c["diloco"].update(compression="int4"), c.update(comm={"backend": "hivemind"})),
     "diloco.compression: int4 has no hivemind codec"),
])
def test_bad_values_name_the_field(tmp_path, mutate, expected):
    config = small_config([dict(node, emulate=dict(node["emulate"])) for node in NODES])
    mutate(config)
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, config)
    assert expected in str(caught.value)
    assert str(tmp_path / "run.yaml") in str(caught.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(tmp_path / "empty.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_overrides_apply_and_bad_overrides_fail(tmp_path):
    path = write_config(tmp_path, small_config(NODES))
    config = load_config(path, ["diloco.rounds=7", "nodes.1.emulate.step_time_s=0.5"])
    assert config.diloco.rounds == 7 and config.nodes[1].emulate.step_time_s == 0.5
    with pytest.raises(ConfigError, match=r"--set gpu_files.0: gpu_files is no list in this config to index into; "
                                          r"give the whole list as YAML, e.g. --set \"gpu_files=\[...\]\""):
        load_config(path, ["gpu_files.0=extra.yaml"])
    # the form error messages name a list entry by
    named = load_config(path, ["nodes[1].emulate.step_time_s=0.25", "nodes[-1].site=far"])
    assert named.nodes[1].emulate.step_time_s == 0.25 and named.nodes[-1].site == "far"
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        load_config(path, ["diloco.rounds"])
    for bad_yaml in ("[1", "{a: "):
        with pytest.raises(ConfigError, match=r"--set diloco.rounds: the value .* is not valid YAML .*quote it"):
            load_config(path, [f"diloco.rounds={bad_yaml}"])


def test_cli_reports_config_errors_in_one_line_and_exits_2(tmp_path):
    config = small_config(NODES)
    config["diloco"]["batch_size"] = "four"
    result = geodiloco("run", "--config", str(write_config(tmp_path, config)), "--sites", "local")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "diloco.batch_size: Input should be a valid integer" in result.stderr


def test_sync_defaults_follow_the_backend(tmp_path):
    torch_config = load(tmp_path, small_config(NODES, diloco={"rounds": 1}))
    assert (torch_config.diloco.overlap, torch_config.diloco.compression) == ("streaming", "int8")
    hivemind = small_config(NODES, diloco={"rounds": 1}, comm={"backend": "hivemind"})
    hivemind_config = load(tmp_path, hivemind)
    assert (hivemind_config.diloco.overlap, hivemind_config.diloco.compression) == ("none", "none")
    assert "overlap: none" in hivemind_config.to_yaml()


@pytest.mark.parametrize("emulate, gpus, source", [
    ({"gpu": "RTX 3900"}, ["RTX 3090"], "nodes[1].emulate.gpu: unknown GPU 'RTX 3900' (closest known"),
    ({"gpu": "from_gpus"}, ["Zorg 1"], "nodes[1].gpus (emulate.gpu: from_gpus): unknown GPU 'Zorg 1'"),
])
def test_an_emulated_gpu_must_be_a_known_row_while_a_real_one_need_not(tmp_path, emulate, gpus, source):
    from geodiloco.runtime.preflight import check_emulated_gpus

    nodes = [NODES[0], {"name": "b", "gpus": gpus, "emulate": emulate}]
    with pytest.raises(ConfigError) as caught:
        check_emulated_gpus(load(tmp_path, small_config(nodes)))
    assert str(caught.value).startswith(source)
    assert "a virtual GPU runs at its table row's speed" in str(caught.value)
    # the same unknown name as a node's real GPU (not emulated) plans from a stand-in: no error
    real = [NODES[0], {"name": "b", "gpus": ["Zorg 1"], "emulate": {"step_time_s": 0.1}}]
    check_emulated_gpus(load(tmp_path, small_config(real)))
    known = [NODES[0], {"name": "b", "gpus": ["RTX 3090"], "emulate": {"gpu": "A30"}}]
    check_emulated_gpus(load(tmp_path, small_config(known)))


def test_nodes_run_here_must_fit_this_hosts_memory(tmp_path):
    from geodiloco.runtime.preflight import available_host_memory_gib, check_host_memory
    from geodiloco.predictor.workload import training_memory_bytes

    config = load(tmp_path, small_config(NODES, diloco={"batch_size": 100_000}))
    dims = config.model.dims()
    # the two nodes list no GPUs: each pass is the whole batch
    one_node_gib = training_memory_bytes(dims, 100_000, config.model.seq_len, config.model.precision).total / 2**30
    with pytest.raises(ConfigError, match=r"^diloco.batch_size: the 2 nodes this machine runs need about "
                                          rf"{2 * one_node_gib:.1f} GiB .*passes of 100000 samples"):
        check_host_memory(config, available_gib=2 * one_node_gib * 0.99)
    check_host_memory(config, available_gib=2 * one_node_gib * 1.01)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   20971520 kB\n")
    assert available_host_memory_gib(meminfo) == pytest.approx(20.0)
    meminfo.write_text("MemTotal:       32000000 kB\n")
    assert available_host_memory_gib(meminfo) is None


def test_a_reference_node_the_config_lacks_and_a_repeated_name_are_refused_when_the_config_loads():
    # the reference node was checked only by the nodes' planners, after every node had started
    with pytest.raises(ConfigError, match=r"balancing.reference_node: no node named 'nodex'; use slowest, fastest "
                                          r"or one of: node1, node2, node3, node4"):
        load_config(None, ["balancing.reference_node=nodex"])
    assert load_config(None, ["balancing.reference_node=node3"]).balancing.reference_node == "node3"
    with pytest.raises(ConfigError, match=r"nodes\[0\].name, nodes\[1\].name repeat 'node1': rename all but one"):
        load_config(None, ["nodes[1].name=node1"])


@pytest.mark.parametrize("overrides, message", [
    (["optim.inner.betas=[0.9]"], "optim.inner.betas: two numbers [beta1, beta2] are needed, e.g. [0.9, 0.95]; got 1"),
    (["model.file=dims.json"], "(got preset, file); set the others to null (e.g. --set model.preset=null)"),
    (["model.preset=null", "model.file=/nope/dims.json"], "model.file: model '/nope/dims.json': not a preset"),
    (["model.preset=null", "model.hf={pretrained: /nope}"], "model.hf.pretrained: /nope does not exist; give a "
                                                           "save_pretrained directory"),
])
def test_model_and_optimizer_mistakes_name_the_field_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(None, overrides)
    assert message in str(refused.value)


def test_a_model_file_with_an_adaptive_embedding_count_is_refused_since_the_runtime_trains_a_full_one(tmp_path):
    dims = tmp_path / "dims.json"
    dims.write_text('{"hidden_size": 64, "intermediate_size": 176, "num_layers": 2, "num_heads": 4, '
                    '"vocab_size": 256, "max_seq_len": 64, "embedding_parameters": 1000}')
    with pytest.raises(ConfigError, match=r"model.file: .*dims.json gives embedding_parameters, an adaptive input "
                                          r"embedding that the runtime's decoder does not have"):
        load_config(None, ["model.preset=null", f"model.file={dims}"]).model.dims()
