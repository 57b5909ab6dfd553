"""tfgc_ops keeps its public names, each with its arguments, wherever its wrappers live."""
import inspect
import os

import tfgc_ops

# Every public wrapper and its parameters (names and defaults, annotations aside): code
# outside this repository calls them by these names.
WRAPPERS = {
    "batch_largest_magnitude": "(x, sizes)",
    "batch_quartic_fold": "(x, scales, sizes)",
    "batch_quartic_unfold": "(quartic, scales, sizes)",
    "bitmap_expand": "(bitmap, values, n)",
    "check_flag_bits": "(flag_bits, what='flag_bits')",
    "chunk_top_k_decode": "(positions, codes, levels, n, chunk, kept)",
    "chunk_top_k_encode": "(x, chunk, kept)",
    "largest_magnitude": "(x)",
    "log_levels_decode": "(packed, scale, n, bits)",
    "log_levels_encode": "(x, largest, bits)",
    "magnitude_filter": "(v, factor)",
    "magnitude_select": "(x, wanted, positions='bitmap', non_finite_in_wanted=False)",
    "momentum_sign_bits_encode": "(momentum, x, beta)",
    "pack_bits": "(codes, bits)",
    "pack_keys": "(keys, flag_bits=2)",
    "positions_expand": "(positions, values, n)",
    "qsgd_decode": "(packed, norms, n, bits, bucket_size)",
    "qsgd_encode": "(x, norms, seed, bits, bucket_size)",
    "qsgd_norms": "(x, bucket_size)",
    "quartic_entropy_decode": "(encoded, groups)",
    "quartic_entropy_encode": "(quartic, groups)",
    "quartic_fold": "(x, scale)",
    "quartic_unfold": "(quartic, n, scale)",
    "row_sums": "(rows, indices, num_rows)",
    "sign_bits_encode": "(x)",
    "stochastic_ternary_fold": "(x, scale, seed)",
    "uniform_quantize": "(x, low, step, bits)",
    "unpack_bits": "(packed, bits, n)",
    "unpack_keys": "(packed)",
    "value_range": "(x)",
    "zero_run_decode": "(encoded)",
    "zero_run_encode": "(quartic)",
}


def unannotated(function):
    signature = inspect.signature(function)
    return str(signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty))


def test_all_lists_the_wrappers_and_the_library_path():
    assert sorted(tfgc_ops.__all__) == sorted([*WRAPPERS, "library_path"])


def test_every_wrapper_keeps_its_arguments():
    for name, parameters in WRAPPERS.items():
        assert unannotated(getattr(tfgc_ops, name)) == parameters, name


def test_every_wrapper_lives_in_a_family_module_and_is_annotated():
    for name in WRAPPERS:
        function = getattr(tfgc_ops, name)
        module = function.__module__
        assert module.startswith("tfgc_ops.") and not module.startswith("tfgc_ops._"), name
        assert name in getattr(tfgc_ops, module.split(".")[1]).__all__, name
        signature = inspect.signature(function)
        assert signature.return_annotation is not signature.empty, name
        assert all(p.annotation is not p.empty for p in signature.parameters.values()), name


def test_constants_and_the_loaded_library():
    assert (tfgc_ops.MIN_FLAG_BITS, tfgc_ops.MAX_FLAG_BITS) == (1, 5)
    assert os.path.exists(tfgc_ops.library_path)


def test_the_numpy_oracle_is_not_part_of_the_package():
    import reference_ops

    package = os.path.dirname(tfgc_ops.__file__)
    assert not os.path.exists(os.path.join(package, "reference.py"))
    assert os.path.dirname(reference_ops.__file__) == os.path.dirname(os.path.abspath(__file__))
