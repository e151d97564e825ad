"""Resource lists: round trips, the conservative view of heterogeneous groups, and every validation error."""
import copy
import dataclasses
import json

import pytest

from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import DEVICES, GiB, parse_cluster
from partita.costmodel.hardware.resources import SCHEMA, cluster_from_dict, cluster_to_dict, load_resources, save_resources

CUSTOM = {"name": "box", "peak_flops": {"bf16": 4.0e10, "fp32": 8.0e10}, "memory_bytes": 8.0e9,
          "mem_bandwidth": 1.2e10, "intra_node_bw": 2.0e9, "inter_node_bw": 1.0e8,
          "intra_node_latency": 3.0e-4, "inter_node_latency": 1.0e-3, "matmul_efficiency": 0.6,
          "host_bw": 1.2e10, "reserved_bytes": 2.5e8}

HETERO = {
    "schema": SCHEMA, "name": "lab",
    "groups": [
        {"name": "a100", "nodes": 2, "devices_per_node": 8, "device": "A100-80GB"},
        {"name": "v100", "nodes": 4, "devices_per_node": 4, "device": "V100-32GB"},
        {"name": "box", "nodes": 1, "devices_per_node": 2, "device": CUSTOM},
    ],
    "inter_group_bw": 5.0e9, "inter_group_latency": 2.0e-5,
}


def _write(tmp_path, d, name="c.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_round_trip_heterogeneous(tmp_path, suffix):
    c = cluster_from_dict(HETERO)
    path = str(tmp_path / f"lab{suffix}")
    save_resources(c, path, name="lab", measurements={"note": "kept, not read"})
    back = parse_cluster(path)
    assert back == dataclasses.replace(c, spec=path)
    assert [g.spec for g in back.groups] == ["a100", "v100", "box"]
    assert back.groups[0].device == DEVICES["A100-80GB"] and back.groups[2].device.name == "box"
    if suffix == ".json":
        assert json.loads(open(path).read())["measurements"] == {"note": "kept, not read"}


def test_round_trip_of_a_cluster_string(tmp_path):
    c = parse_cluster("4x8xH100-80GB")
    path = str(tmp_path / "h100.json")
    d = save_resources(c, path)
    assert d["groups"] == [{"name": "4x8xH100-80GB", "nodes": 4, "devices_per_node": 8, "device": "H100-80GB"}]
    back = parse_cluster(path)
    assert (back.nodes, back.devices_per_node, back.device, back.num_devices) == (4, 8, c.device, 32)
    assert not back.heterogeneous and len(back.groups) == 1
    assert cluster_to_dict(back) == d


def test_heterogeneous_view_is_conservative():
    c = cluster_from_dict(HETERO)
    a, v = DEVICES["A100-80GB"], DEVICES["V100-32GB"]
    assert c.heterogeneous
    assert c.num_devices == 16 + 16 + 2 == sum(g.num_devices for g in c.groups)
    assert c.devices_per_node == 2 and c.nodes == 17          # gcd(8, 4, 2) devices per "node"
    d = c.device
    assert d.name == "min(A100-80GB,V100-32GB,box)"
    assert d.peak("bf16") == 4.0e10 and d.peak("fp32") == min(v.peak("fp32"), 8.0e10)
    assert d.memory_bytes == 8.0e9 and d.reserved_bytes == max(a.reserved_bytes, 2.5e8)
    assert d.intra_node_bw == 2.0e9 and d.inter_node_bw == 1.0e8
    assert d.inter_node_latency == 1.0e-3 and d.matmul_efficiency == 0.6
    # the link between groups bounds the off-node figures
    two = cluster_from_dict({**HETERO, "groups": HETERO["groups"][:2], "inter_group_bw": 5.0e9})
    assert two.device.inter_node_bw == 5.0e9 and two.device.mem_bandwidth == v.mem_bandwidth


def test_one_group_keeps_its_device_and_shape(tmp_path):
    d = {"schema": SCHEMA, "groups": [{"name": "box", "nodes": 1, "devices_per_node": 2, "device": CUSTOM}]}
    c = parse_cluster(_write(tmp_path, d))
    assert (c.nodes, c.devices_per_node, c.device.name, c.device.peak("fp32")) == (1, 2, "box", 8.0e10)
    assert c.describe()["groups"][0]["name"] == "box"


def test_base_preset_fills_the_rest(tmp_path):
    d = {"schema": SCHEMA, "groups": [{"name": "g", "nodes": 1, "devices_per_node": 4,
                                       "device": {"name": "cpu", "base": "cpu", "mem_bandwidth": 2.0e10}}]}
    c = parse_cluster(_write(tmp_path, d, "c.yaml"))  # JSON is valid YAML
    assert c.device == dataclasses.replace(DEVICES["cpu"], mem_bandwidth=2.0e10)


def _with(path, value):
    """HETERO with the key at `path` (a tuple of keys/indices) set to `value` (None: deleted)."""
    d = copy.deepcopy(HETERO)
    *head, last = path
    node = d
    for k in head:
        node = node[k]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return d


BAD = [
    (_with(("schema",), "partita.cluster/9"), "schema: must be 'partita.cluster/1'"),
    (_with(("groups",), []), "groups: must be a non-empty list"),
    (_with(("extra",), 1), r"top level: unknown key\(s\) 'extra'; accepted: groups, inter_group_bw"),
    (_with(("groups", 0), "A100-80GB"), r"groups\[0\]: must be an object"),
    (_with(("groups", 0, "nodes"), None), r"groups\[0\]: missing nodes"),
    (_with(("groups", 0, "nodes"), 0), r"groups\[0\] \(a100\)\.nodes: must be an integer >= 1, got 0"),
    (_with(("groups", 1, "devices_per_node"), 2.5), r"\(v100\)\.devices_per_node: must be an integer"),
    (_with(("groups", 1, "name"), "a100"), "duplicate group name 'a100'"),
    (_with(("groups", 0, "speed"), 3), r"groups\[0\]: unknown key\(s\) 'speed'; accepted: device, devices_per_node"),
    (_with(("groups", 0, "device"), "B200"), r"\(a100\)\.device: unknown device preset 'B200'; presets: V100-16GB"),
    (_with(("groups", 0, "device"), 7), r"\.device: must be a preset name or an object"),
    (_with(("groups", 2, "device", "memory_bytes"), None), r"\(box\)\.device: missing memory_bytes"),
    (_with(("groups", 2, "device", "mem_bandwidth"), -1), r"\.device\.mem_bandwidth: must be > 0, got -1"),
    (_with(("groups", 2, "device", "mem_bandwidth"), "1e10 B/s"), r"\.device\.mem_bandwidth: must be a number, got '1e10 B/s'$"),
    (_with(("groups", 2, "device", "host_bw"), True), r"\.device\.host_bw: must be a number, got True"),
    (_with(("groups", 2, "device", "intra_node_latency"), -1e-6), r"intra_node_latency: must be >= 0"),
    (_with(("groups", 2, "device", "peak_flops"), {"fp32": 1e9}), r"peak_flops: must be an object with exactly"),
    (_with(("groups", 2, "device", "peak_flops", "bf16"), 0), r"peak_flops\.bf16: must be > 0"),
    (_with(("groups", 2, "device", "matmul_efficiency"), 1.5), r"matmul_efficiency: must be in \(0, 1\]"),
    (_with(("groups", 2, "device", "reserved_bytes"), 9e9), r"reserved_bytes: must be less than memory_bytes"),
    (_with(("groups", 2, "device", "turbo"), 1), r"\.device: unknown key\(s\) 'turbo'; accepted: allocator_headroom, attention_bwd_efficiency, attention_causal_block, "
                                                         r"attention_efficiency, attention_half_dim"),
    (_with(("groups", 2, "device", "stack"), "jax"), r"\.device\.stack: unknown software stack 'jax'"),
    (_with(("groups", 2, "device", "other_attention"), {"cudnn": {"efficiency": 0.5}}),
     r"other_attention\.cudnn: must be an object with exactly the keys"),
    (_with(("groups", 2, "device", "base"), "TPU"), r"\.device\.base: unknown device preset 'TPU'"),
    (_with(("groups", 2, "device", "name"), ""), r"\.device\.name: must be a non-empty string"),
    (_with(("inter_group_bw",), 0), "inter_group_bw: must be > 0"),
    (_with(("inter_group_latency",), "fast"), "inter_group_latency: must be a number"),
    ([1, 2], "top level: must be an object"),
    (_with(("kernels",), {"kind": "gemm"}), "kernels: must be a list of kernel rows, got dict"),
    (_with(("kernels",), [{"mkn": [1, 2, 3]}]), r"kernels\[0\]: must be an object with a 'kind'"),
]


@pytest.mark.parametrize("doc,needle", BAD, ids=[n[:40] for _, n in BAD])
def test_validation_errors_name_the_field(tmp_path, doc, needle):
    with pytest.raises(PartitaError, match=needle):
        parse_cluster(_write(tmp_path, doc))


def test_file_errors(tmp_path):
    with pytest.raises(PartitaError, match="cluster file '.*nope.json' not found"):
        parse_cluster(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PartitaError, match="is not valid JSON"):
        parse_cluster(str(bad))
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("groups: [unclosed")
    with pytest.raises(PartitaError, match="is not valid YAML"):
        load_resources(bad_yaml)
    # an existing file without a suffix is a resource list too
    plain = tmp_path / "cluster"
    plain.write_text(json.dumps(HETERO))
    assert parse_cluster(str(plain)).num_devices == 34


def test_cluster_strings_still_parse():
    c = parse_cluster("2x8xA100-80GB")
    assert c.groups == () and c.group_list() == (c,) and c.device.reserved_bytes == 2 * GiB


def test_yaml_numbers_in_scientific_notation_are_numbers(tmp_path):
    """Issue 30 item 10: PyYAML reads 1e9 and 1.0e9 as strings (only 1.0e+9 as a float); they are numbers."""
    text = ("schema: partita.cluster/1\ngroups:\n- name: box\n  nodes: 1\n  devices_per_node: 2\n  device:\n    name: box\n"
            "    peak_flops: {bf16: 4e10, fp32: 8.0e10}\n    memory_bytes: 8.0e9\n    mem_bandwidth: 1.2E10\n"
            "    intra_node_bw: 2e+9\n    inter_node_bw: 1.0e8\n    intra_node_latency: 3e-4\n")
    import yaml
    assert isinstance(yaml.safe_load(text)["groups"][0]["device"]["memory_bytes"], str)  # what PyYAML does
    (tmp_path / "c.yaml").write_text(text)
    d = load_resources(str(tmp_path / "c.yaml")).device
    assert (d.peak_flops, d.memory_bytes, d.mem_bandwidth) == ({"bf16": 4e10, "fp32": 8e10}, 8e9, 1.2e10)
    assert (d.intra_node_bw, d.inter_node_bw, d.intra_node_latency) == (2e9, 1e8, 3e-4)
