"""Weights stored at a device's precision (scripts/layers/weight_precision.py, scripts/litert/weight_storage.py):
the torch model is quantized once, the converted graph re-encodes exactly those values (never rounding them
itself), and the LiteRT graph computes what the quantized torch model does, to float32 rounding."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from scripts.checks import compare
from scripts.layers import weight_precision
from scripts.litert import export, tflite_file, weight_storage
from scripts.litert.cpu_graph import CpuGraph
from scripts.pipeline.errors import ClefError
from scripts.qwen35.host import litert_signature


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(128, 512), torch.nn.Linear(512, 128)

    def forward(self, x):
        return {"y": self.down(torch.relu(self.up(x)))}


X = torch.randn(1, 16, 128, generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def base() -> Mlp:
    torch.manual_seed(0)
    m = Mlp().eval()
    with torch.no_grad():  # bf16 values, as a checkpoint's are: float16 holds them exactly
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return m


def graph(model, precision, tmp, scheme=None):
    raw, out = tmp / f"{precision}_{scheme or 'default'}.raw", tmp / f"{precision}_{scheme or 'default'}.tflite"
    export.convert(model, {"x": X}, raw)
    return out, weight_storage.store(raw, out, precision, scheme)


def run(path, dynamic_kernels: bool = False) -> torch.Tensor:
    """The graph on the CPU: its exact form (integer weights read through a DEQUANTIZE), or as stored."""
    return litert_signature(CpuGraph(path, dynamic_kernels=dynamic_kernels).get_signature_runner())(x=X)["y"]


def exact(model) -> torch.Tensor:
    with torch.no_grad():
        return copy.deepcopy(model).double()(X.double())["y"]


@pytest.fixture(scope="module")
def graphs(base, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("weights")
    out = {}
    for precision in ("fp32", "fp16", "int8", "int4", "int4b32"):
        model = copy.deepcopy(base)
        weight_precision.apply(model, precision)
        out[precision] = (
            model,
            *graph(model, precision, tmp, "dynamic" if weight_precision.integer(precision) else None),
        )
    for precision in ("int8", "int4"):  # a DEQUANTIZE before each reader (the pipeline's scheme: the fp16 one)
        out[f"{precision}_weight_only"] = (out[precision][0], *graph(out[precision][0], precision, tmp, "weight_only"))
    return out


def test_fp16_storage_halves_the_weights_and_changes_no_output(graphs):
    _, fp32, _ = graphs["fp32"]
    model, fp16, stored = graphs["fp16"]
    assert stored.weights == 2 and stored.kept_float32 == 0
    assert stored.stored_bytes * 2 == stored.float32_bytes
    assert fp16.stat().st_size < 0.55 * fp32.stat().st_size
    census = tflite_file.census(fp16)
    assert census["ops"]["DEQUANTIZE"] == 2 and census["dtypes"]["FLOAT16"] == 2
    assert tflite_file.violations(census) == []
    # bf16 weights, the same values: the graphs differ by float32 rounding alone (the CPU accelerator
    # packs float16 weights for another kernel, which sums in another order)
    assert compare.rel(run(fp16), run(fp32)) < 1e-6
    assert compare.rel(run(fp16).double(), exact(model)) < 1e-5


def test_int8_storage_is_a_quarter_and_computes_the_dequantized_weights(graphs):
    model, int8, stored = graphs["int8_weight_only"]
    _, fp32, _ = graphs["fp32"]
    assert stored.weights == 2 and stored.kept_float32 == 0
    assert stored.stored_bytes <= 0.26 * stored.float32_bytes
    assert int8.stat().st_size < 0.30 * fp32.stat().st_size
    # the conversion error: against the same int8 weights in float64
    assert compare.rel(run(int8).double(), exact(model)) < 1e-5


def test_int4_storage_read_through_a_dequantize_computes_the_dequantized_weights(graphs):
    model, int4, stored = graphs["int4_weight_only"]
    _, fp32, _ = graphs["fp32"]
    assert stored.weights == 2 and stored.kept_float32 == 0 and stored.scheme == "weight_only"
    assert stored.stored_bytes <= 0.14 * stored.float32_bytes
    assert compare.rel(run(int4).double(), exact(model)) < 1e-5


def test_blockwise_weights_are_not_stored_for_a_dequantize(graphs, tmp_path):
    """TensorFlow Lite's DEQUANTIZE reads no blockwise scales (the CPU answered 0.97 off when it was tried)."""
    model, _, _ = graphs["int4b32"]
    with pytest.raises(ClefError, match="weights int4b32: blockwise weights are read by the FULLY_CONNECTED itself"):
        graph(model, "int4b32", tmp_path, "weight_only")
    assert not (tmp_path / "int4b32_weight_only.tflite").exists()


def test_the_quantization_effect_is_a_separate_figure(base, graphs):
    """Against the unquantized model the int8 graph is off by the quantization, far over the conversion error."""
    model, int8, _ = graphs["int8_weight_only"]
    effect = compare.rel(run(int8).double(), exact(base))
    assert effect > 100 * compare.rel(run(int8).double(), exact(model)), effect


def test_the_storage_never_rounds_a_value_itself(base, tmp_path):
    """A weight that float16 does not hold exactly (not quantized in torch first) stays float32: the graph
    is unchanged, so a missing weight_precision.apply can never pass as a conversion error."""
    model = copy.deepcopy(base)
    weight_precision.apply(model, "fp16")
    with torch.no_grad():
        model.up.weight.add_(1e-6)  # off float16's grid
    path, stored = graph(model, "fp16", tmp_path)
    assert stored.weights == 1 and stored.kept_float32 == 1
    assert torch.equal(run(path), run(tmp_path / "fp16_default.raw"))
    assert compare.rel(run(path).double(), exact(model)) < 1e-5


def test_int8_codes_reproduce_every_row_or_refuse():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    values = weight_precision.stored_values(w, "int8").numpy()
    codes, scales = weight_storage.encode_rows(values, weight_precision.INT8_LEVELS)
    assert np.array_equal(codes.astype(np.float32) * scales[:, None], values)
    assert np.abs(codes).max() == weight_precision.INT8_LEVELS
    bent = values.copy()
    bent[5, 7] = np.nextafter(bent[5, 7], np.float32(np.inf))  # one element off the row's grid
    assert weight_storage.encode_rows(bent, weight_precision.INT8_LEVELS) is None
    assert weight_storage.encode_fp16(np.array([1.0, 1 + 2**-12], np.float32)) is None


def test_weights_that_cannot_be_stored_are_refused_before_anything_changes(base):
    model = copy.deepcopy(base)
    with torch.no_grad():
        model.down.weight[0, 0] = 1e5
    before = model.up.weight.clone()
    with pytest.raises(ClefError, match=r"weights fp16: down.weight holds 1e\+05, over float16's largest"):
        weight_precision.apply(model, "fp16")
    assert torch.equal(model.up.weight, before)
    with pytest.raises(ClefError, match="weights 'int3' is not one of fp32, fp16, int8, int4"):
        weight_precision.apply(model, "int3")
    with pytest.raises(ClefError, match="weights int8b32: blockwise int8 is refused"):
        weight_precision.apply(model, "int8b32")
    with pytest.raises(ClefError, match="weights int4b48: block 48 is not one of 32, 64, 128, 256"):
        weight_precision.apply(model, "int4b48")
    narrow = torch.nn.Linear(96, 8)
    with pytest.raises(ClefError, match="weights int4b64: .weight has 96 inputs, not a multiple of the block 64"):
        weight_precision.apply(narrow, "int4b64")
    assert torch.equal(model.up.weight, before)


@pytest.mark.parametrize("weights", ["int8", "int4", "int4b32"])
def test_the_cpus_dynamic_kernels_compute_the_model_whose_linears_read_quantized_rows(graphs, weights):
    """int8 and int4 graphs (the dynamic scheme) run XNNPACK's dynamic kernels on the CPU, which quantize each
    input row to int8: against the plain model with the same weights the CPU is off by that, over the
    conversion bound of 1e-4; against the model whose Linears read dynamic_activations.quantized_rows it is
    float32 rounding. Broken on purpose: blockwise scales not on bfloat16's grid (float16's alone, as they
    were at first) put the int4b32 graph 2e-3 off the same reference (tests below)."""
    from scripts.qwen35 import model_change

    model, path, stored = graphs[weights]
    assert stored.weights == 2 and stored.scheme == "dynamic" and "DEQUANTIZE" not in tflite_file.census(path)["ops"]
    got = run(path, dynamic_kernels=True).double()
    assert compare.rel(got, exact(model)) > 1e-4
    with model_change.changed(model, dynamic_activations=True):
        assert compare.rel(got, exact(model)) < 1e-5
    assert compare.rel(got, exact(model)) > 1e-4  # the hooks are gone after the block


def test_int4_blockwise_scales_off_bfloat16s_grid_break_the_cpus_reference(base, tmp_path, monkeypatch):
    """XNNPACK reads blockwise scales as bfloat16: scales rounded to float16 alone (stored exactly) compute
    something else on the CPU than the model with those scales."""
    from scripts.qwen35 import model_change

    def fp16_only(w, block):
        absmax = w.reshape(w.shape[0], -1, block).abs().amax(dim=2)
        return (absmax / weight_precision.INT4_LEVELS).to(torch.float16).to(torch.float32)

    monkeypatch.setattr(weight_precision, "block_scales", fp16_only)
    model = copy.deepcopy(base)
    weight_precision.apply(model, "int4b32")
    path, stored = graph(model, "int4b32", tmp_path, "dynamic")
    assert stored.weights == 2
    with model_change.changed(model, dynamic_activations=True):
        assert compare.rel(run(path, dynamic_kernels=True).double(), exact(model)) > 1e-4


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_every_check_runs_a_dynamic_graph_in_its_exact_form(graphs, weights, tmp_path):
    """The CPU's default (what every check runs) reads each integer weight through a DEQUANTIZE: the same
    codes and scales, computed in float32 as torch does (the file as stored is the dynamic kernels'
    ~1e-2, test above). The rewrite changes nothing else: the same ops but the DEQUANTIZEs, every
    integer weight still stored once."""
    model, path, _ = graphs[weights]
    graph = CpuGraph(path)
    assert graph.dequantized == 2
    got = litert_signature(graph.get_signature_runner())(x=X)["y"].double()
    assert compare.rel(got, exact(model)) < 1e-5
    assert compare.rel(run(path, dynamic_kernels=True).double(), exact(model)) > 1e-4
    twin = tmp_path / "exact.tflite"
    assert weight_storage.dequantized(path, twin) == 2
    before, after = tflite_file.census(path), tflite_file.census(twin)
    assert after["ops"].pop("DEQUANTIZE") == 2 and after["ops"] == before["ops"]
    assert after["fully_connected_weights"] == before["fully_connected_weights"]  # read through the DEQUANTIZE
    assert abs(twin.stat().st_size - path.stat().st_size) < 4096  # the codes once, not widened


def test_a_graph_without_integer_weights_runs_as_it_is_and_a_blockwise_one_has_no_exact_form(graphs, tmp_path):
    _, fp16, _ = graphs["fp16"]
    assert CpuGraph(fp16).dequantized == 0 and weight_storage.dequantized(fp16, tmp_path / "x.tflite") == 0
    assert not (tmp_path / "x.tflite").exists()
    _, blockwise, _ = graphs["int4b32"]
    with pytest.raises(ClefError, match="is blockwise: no DEQUANTIZE reads it"):
        CpuGraph(blockwise)
    assert compare.rel(run(blockwise, dynamic_kernels=True).double(), exact(graphs["int4b32"][0])) < 1e-1


def test_int4_codes_pack_two_a_byte_the_even_one_low():
    codes = np.array([-7, 7, 0, -1, 3], np.int8)
    packed = weight_storage.pack_int4(codes)
    assert packed.tolist() == [0x79, 0xF0, 0x03]  # -7 = 0x9 low, 7 high; 0 low, -1 = 0xF high; 3, pad


def test_int4_blockwise_codes_reproduce_every_block_or_refuse():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(4))
    values = weight_precision.stored_values(w, "int4b32").numpy()
    codes, scales = weight_storage.encode_blocks(values, 32)
    assert scales.dtype == np.float16 and scales.shape == (16, 2) and np.abs(codes).max() == 7
    back = codes.astype(np.float32).reshape(16, 2, 32) * scales.astype(np.float32)[..., None]
    assert np.array_equal(back.reshape(16, 64), values)
    bent = values.copy()
    bent[3, 40] = np.nextafter(bent[3, 40], np.float32(np.inf))
    assert weight_storage.encode_blocks(bent, 32) is None


def test_a_0_1_selection_stays_float32_under_the_dynamic_scheme(tmp_path):
    """The kernel form's 0/1 constants (dd's segment sums) read by a FULLY_CONNECTED are not Linear weights:
    stored as integers, the CPU's dynamic kernels would quantize what they select (the decays)."""

    class Select(torch.nn.Module):
        def forward(self, x):
            return {"y": x @ SELECT.T}

    path, stored = graph(Select(), "int8", tmp_path, "dynamic")
    assert stored.weights == 0 and stored.selections == 1 and stored.kept_float32 == 0
    assert tflite_file.census(path)["fully_connected_weights"] == {"FLOAT32": 1}
    assert torch.equal(run(path), X @ SELECT.T)


SELECT = (torch.arange(128)[None, :] <= torch.arange(64)[:, None]).float()  # [64, 128] of 0 and 1


def test_each_dequantize_sits_just_before_the_first_op_that_reads_its_weight(graphs):
    from ai_edge_litert.tools import flatbuffer_utils

    _, path, _ = graphs["fp16"]
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
    ops = [(tflite_file.op_name(model, op), list(op.inputs), list(op.outputs)) for op in model.subgraphs[0].operators]
    for i, (name, _, outs) in enumerate(ops):
        if name == "DEQUANTIZE":
            assert ops[i + 1][0] == "FULLY_CONNECTED" and outs[0] in ops[i + 1][1], ops


def test_the_census_tells_the_stored_precision_and_a_mismatch_is_named(graphs):
    held = {p: tflite_file.census(graphs[p][1])["fully_connected_weights"] for p in graphs}
    assert held == {
        "fp32": {"FLOAT32": 2},
        "fp16": {"FLOAT16": 2},
        "int8": {"INT8": 2},
        "int8_weight_only": {"INT8": 2},
        "int4": {"INT4": 2},
        "int4_weight_only": {"INT4": 2},
        "int4b32": {"INT4/block32": 2},
    }
    spellings = ("fp32", "fp16", "int8", "int4", "int4b32", "int4b64")
    for p in graphs:
        census = tflite_file.census(graphs[p][1])
        declared = p.removesuffix("_weight_only")
        assert weight_storage.mismatch(census, declared) == []
        others = [q for q in spellings if q != declared]
        assert all(weight_storage.mismatch(census, q) for q in others), p
    assert weight_storage.mismatch(tflite_file.census(graphs["int4b32"][1]), "int4b64") == [
        "metadata says weights int4b64, but FULLY_CONNECTED weights are stored as INT4/block32",
        "metadata says weights int4b64, but no FULLY_CONNECTED weight is stored as INT4/block64",
    ]
    assert weight_storage.mismatch(tflite_file.census(graphs["fp16"][1]), "fp32") == [
        "metadata says weights fp32, but FULLY_CONNECTED weights are stored as FLOAT16"
    ]


def test_the_graphs_weight_storage_entry_is_the_stored_record(base, tmp_path):
    """export.write embeds what `store` did as the graph's `weight_storage` metadata: the Stored record
    with every field, as dataclasses.asdict gave it before Stored was a record, read back whole."""
    import dataclasses

    model = copy.deepcopy(base)
    applied = weight_precision.apply(model, "fp16")
    raw, out = tmp_path / "fp16.raw", tmp_path / "fp16.tflite"
    export.convert(model, {"x": X}, raw)
    export.write(out, raw, {"weights": "fp16"}, applied)
    entry = tflite_file.read_metadata(out)["weight_storage"]
    stored = weight_storage.Stored.from_json(entry, str(out))
    assert stored.precision == "fp16" and stored.weights == 2 and stored.bytes > 0
    assert stored.to_json() == entry
    assert dataclasses.asdict(stored) == {**dict.fromkeys(("block", "selections")), **entry}  # fp16's entry as before
    assert list(stored.to_json()) == [f.name for f in dataclasses.fields(weight_storage.Stored)][:-2]


def test_export_refuses_a_graph_whose_metadata_names_another_precision(graphs, tmp_path):
    import shutil

    _, path, _ = graphs["int8"]
    raw = tmp_path / "copy.raw"
    shutil.copy(path, raw)
    out = tmp_path / "out.tflite"
    with pytest.raises(ClefError, match="metadata says weights fp16, but FULLY_CONNECTED weights are stored as INT8"):
        export._write(out, raw, {"weights": "fp16"})
    assert not out.exists()


def test_the_card_says_every_precision():
    from scripts.pipeline.params import WEIGHT_PRECISIONS
    from scripts.release import card

    assert tuple(card.WEIGHTS_SAID) == WEIGHT_PRECISIONS == tuple(weight_storage.STORED_TYPE)


def test_the_gpu_accelerator_takes_fp16_weights_and_refuses_a_dequantized_int8_naming_the_op(graphs):
    """Why the pipeline's int8 and int4 are read by the FULLY_CONNECTED itself: through a DEQUANTIZE, the
    accelerator refuses them while it builds the kernel (it folds only a float16 DEQUANTIZE)."""
    from scripts.litert import gpu_accelerator

    model, fp16, _ = graphs["fp16"]
    for mode in gpu_accelerator.MODES:
        compiled = gpu_accelerator.compile(fp16, mode)
        assert compiled.fully_accelerated
        if mode == "fp32":
            got = compiled.signature("serving_default")(x=X)["y"]
            assert compare.rel(got.double(), exact(model)) < 1e-5
        compiled.close()
    _, int8, _ = graphs["int8_weight_only"]
    with pytest.raises(ClefError, match="Shape mismatch"):
        gpu_accelerator.compile(int8, "fp32", tflite_file.census(int8)).close()


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_the_gpu_accelerator_reads_int8_and_int4_weights_itself_in_every_mode(graphs, weights):
    """The dynamic scheme's per-row int8 and int4 weights are taken whole in every mode, and in fp32 the GPU
    computes the plain model with those weights (float activations) to float32 rounding."""
    from scripts.litert import gpu_accelerator

    model, path, _ = graphs[weights]
    for mode in gpu_accelerator.MODES:
        compiled = gpu_accelerator.compile(path, mode)
        assert compiled.fully_accelerated, mode
        if mode == "fp32":
            assert compare.rel(compiled.signature()(x=X)["y"].double(), exact(model)) < 1e-5
        compiled.close()


def test_blockwise_weights_are_never_handed_to_the_gpu_accelerator(graphs):
    """Blockwise int4 ends the GPU accelerator's process (free(): invalid next size, exit 134): refused up
    front, in one line naming the stored type (and the pipeline's `weights` never is blockwise)."""
    from scripts.litert import gpu_accelerator

    _, path, _ = graphs["int4b32"]
    with pytest.raises(ClefError, match="FULLY_CONNECTED weights stored INT4/block32: not handed to the GPU"):
        gpu_accelerator.compile(path, "fp32")
    with pytest.raises(ClefError, match="aborts the process on blockwise weights"):
        gpu_accelerator.compile(path, "fp16", tflite_file.census(path))


def test_the_gpu_accelerator_reads_int8_weights_itself_once_each_reader_has_a_rank_2_input(
    graphs, tmp_path, monkeypatch
):
    """With the int8 weight on the FULLY_CONNECTED itself (no DEQUANTIZE), the GPU accelerator computes
    what the quantized torch model does, to float32 rounding, in fp32. It takes it only from a rank-2
    input: with the input flattening off, this graph's first FULLY_CONNECTED (keep_num_dims false on
    [1, 16, 128]) fails to build a kernel, and on the tiny checkpoint's row graph the same pattern
    compiled whole and answered 0.88 of the output's size off (weights bench, int8_dynamic, before)."""
    from scripts.litert import gpu_accelerator

    model, _, _ = graphs["int8"]
    path, _ = graph(model, "int8", tmp_path, "dynamic")
    census = tflite_file.census(path)
    assert "DEQUANTIZE" not in census["ops"] and census["ops"]["RESHAPE"] == 2  # the graph's own and ours
    compiled = gpu_accelerator.compile(path, "fp32")
    assert compiled.fully_accelerated
    got = compiled.signature()(x=X)["y"]
    compiled.close()
    assert compare.rel(got.double(), exact(model)) < 1e-4
    monkeypatch.setattr(weight_storage, "flattened_inputs", lambda *a: False)
    (tmp_path / "off").mkdir()
    unflattened, _ = graph(model, "int8", tmp_path / "off", "dynamic")
    with pytest.raises(ClefError, match="Unable to parse bc coord for BATCH axis"):
        gpu_accelerator.compile(unflattened, "fp32")


def test_a_section_cut_never_separates_a_stored_weight_from_its_reader(graphs):
    """verify_gpu runs a graph in sections: the DEQUANTIZE of a weight goes with its FULLY_CONNECTED, or the
    weight would cross the cut as a runtime tensor. Broken once: with the rule off, the smallest sections
    do cut there."""
    from ai_edge_litert.tools import flatbuffer_utils

    from scripts.litert import sections

    _, path, _ = graphs["fp16"]
    head = tflite_file.read_head(path)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(head))
    sg = model.subgraphs[0]
    stored = {op.outputs[0] for op in sg.operators if tflite_file.op_name(model, op) == "DEQUANTIZE"}
    (plan,) = sections.plan(head, max_bytes=1)
    assert len(plan.sections) >= 2
    assert not any(set(s.inputs) & stored for s in plan.sections), plan.sections
    every_op = sections.sections_at(model, 0, list(plan.outputs.values()), list(range(len(sg.operators) + 1)))
    assert any(set(s.inputs) & stored for s in every_op)  # what a cut after each op would carry


def test_the_weights_bench_compiles_each_precision_for_the_gpu_section_by_section(graphs):
    """At real width the weights bench does not run a graph on the software GPU (hours in four precisions):
    it compiles every section in every mode. fp16 is taken whole in every mode; int8 is refused, in the
    accelerator's words, not reported as accelerated (the check that could pass wrongly)."""
    from scripts.bench import weights_bench
    from scripts.litert import gpu_accelerator

    _, fp16, _ = graphs["fp16"]
    got = weights_bench.gpu_compiled(fp16, 1, tflite_file.census(fp16))
    assert set(got) == set(gpu_accelerator.MODES)
    for mode, g in got.items():
        assert g.compiled and g.fully_accelerated and g.run is False, (mode, g)
        assert g.sections >= 2  # max_bytes=1: one section per weight
    _, int8, _ = graphs["int8_weight_only"]
    got = weights_bench.gpu_compiled(int8, 1, tflite_file.census(int8))
    assert all(not g.compiled and "Shape mismatch" in g.refused for g in got.values()), got


def test_sections_are_sized_by_the_weights_the_accelerator_holds_not_their_stored_bytes(graphs):
    """The GPU accelerator expands a stored fp16 weight to float32: an fp16 graph is cut where its fp32
    twin is. Broken once (cut by stored bytes): at real width each fp16 section held twice the weights it
    was sized for, and verify_gpu overran its memory budget. At a limit just over one fp32 weight the fp32
    graph needs a section per weight, and by stored bytes the fp16, int8 or int4 graph's two weights would
    fit in one (int4 was counted at its stored bytes until it was given its expansion, 8x)."""
    from scripts.litert import sections

    limit = 300_000  # one weight: 128 x 512 x 4 = 262,144 bytes in float32, 131,072 in float16
    counts = {}
    for precision in ("fp32", "fp16", "int8_weight_only", "int4_weight_only"):
        _, path, _ = graphs[precision]
        (plan,) = sections.plan(tflite_file.read_head(path), limit)
        counts[precision] = len(plan.sections)
        assert all(s.constant_bytes <= limit for s in plan.sections), (precision, plan.sections)
    assert counts["int4_weight_only"] == counts["int8_weight_only"] == counts["fp16"] == counts["fp32"] >= 2, counts


class Tied(torch.nn.Module):
    """One Linear applied twice: the converter stores its weight once, read by two FULLY_CONNECTEDs (as the
    synthetic real-width checkpoint's repeated layers are)."""

    def __init__(self):
        super().__init__()
        self.square = torch.nn.Linear(128, 128)

    def forward(self, x):
        return {"y": self.square(torch.relu(self.square(x)))}


def test_a_weight_read_by_two_ops_gets_a_dequantize_each_so_a_section_cut_can_fall_between(tmp_path):
    """A stored weight read through one DEQUANTIZE by several FULLY_CONNECTEDs ties them into one section:
    broken once, at real width a row graph's section held 1.63 GiB at a 0.81 GiB limit and verify_gpu
    overran its memory budget. Each reader now has its own DEQUANTIZE of the one stored buffer: the file
    holds the weight once, computes what the model does, and at a limit of one weight is cut in two."""
    from ai_edge_litert.tools import flatbuffer_utils

    from scripts.litert import sections

    torch.manual_seed(1)
    model = Tied().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    path, stored = graph(model, "fp16", tmp_path)
    head = tflite_file.read_head(path)
    tree = flatbuffer_utils.convert_bytearray_to_object(bytearray(head))
    ops = [(tflite_file.op_name(tree, op), list(op.inputs), list(op.outputs)) for op in tree.subgraphs[0].operators]
    dequantized = [outs[0] for name, _, outs in ops if name == "DEQUANTIZE"]
    assert stored.weights == 1 and len(dequantized) == 2, ops
    for i, (name, _, outs) in enumerate(ops):
        if name == "DEQUANTIZE":
            assert ops[i + 1][0] == "FULLY_CONNECTED" and outs[0] in ops[i + 1][1], ops
    assert tflite_file.census(path)["fully_connected_weights"] == {"FLOAT16": 1}
    assert compare.rel(run(path).double(), exact(model)) < 1e-5

    limit = 128 * 128 * 4 + 1024  # one weight at float32, as the accelerator holds it
    (plan,) = sections.plan(head, limit)
    assert len(plan.sections) == 2 and all(s.constant_bytes <= limit for s in plan.sections), plan.sections
    cut = sections.SectionedGraph(path, limit)
    try:  # each section file holds the stored weight once
        for part in cut.sections("serving_default"):
            assert tflite_file.census(part.path)["fully_connected_weights"] == {"FLOAT16": 1}
    finally:
        cut.close()


def test_a_kernel_reading_the_codes_otherwise_breaks_the_dynamic_kernels_bound(graphs, tmp_path):
    """verify_tflite's dynamic-kernels figure (the file as stored against its exact form) guards against the
    CPU's kernels reading the stored codes otherwise than a DEQUANTIZE does. Broken on purpose: the int4
    codes read high nibble first (each packed byte swapped) are over params.yaml's bound, where the
    kernels' activation rounding alone is well under it."""
    from ai_edge_litert.tools import flatbuffer_utils

    from scripts.checks import tflite_verification
    from scripts.pipeline import params

    limits = params.bounds(params.read(), "verify_tflite", tflite_verification.BOUNDED)
    _, path, _ = graphs["int4"]
    data = bytearray(path.read_bytes())
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
    swapped = 0
    for b in weight_storage.read_integer_weights(model)[0]:
        buffer = model.buffers[model.subgraphs[0].tensors[b].buffer]
        packed = np.frombuffer(data, np.uint8, buffer.size, buffer.offset)
        data[buffer.offset : buffer.offset + buffer.size] = ((packed << 4) | (packed >> 4)).astype(np.uint8).tobytes()
        swapped += 1
    assert swapped == 2
    misread = tmp_path / "misread.tflite"
    misread.write_bytes(bytes(data))
    exact_form = run(path)
    rounding = compare.figures("dynamic_kernels", run(path, dynamic_kernels=True)[0], exact_form[0])
    broken = compare.figures("dynamic_kernels", run(misread, dynamic_kernels=True)[0], exact_form[0])
    assert not compare.judge([rounding], limits), rounding
    assert compare.judge([broken], limits), broken
