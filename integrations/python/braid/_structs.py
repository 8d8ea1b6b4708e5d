"""ctypes mirrors of the C ABI's structs and handles (capi/include/braid/*.h), with
their C field names and order.

Besides ``_fields_``, a struct may say how :mod:`braid.records` reads it:

* ``_counts_``: pointer field -> the field holding its length, where that is not the
  pointer's name (singular or not) + ``_count``;
* ``_enums_``: enum field -> the vocabulary (``braid_vocabulary`` value) naming its values;
* ``_bools_``: int32 fields that are 0/1 flags.
"""

from __future__ import annotations

import ctypes

# ---- layout constants of the headers (C macros and enum counts are not readable through ctypes)

#: BRAID_BUBBLE_COUNT (braid/pipeline.h): the length of every bubbles_s array. The
#: loader checks it against the library's BRAID_VOCABULARY_BUBBLE_CAUSE size.
BUBBLE_COUNT = 9

# *_VERSION macros of the option structs.
PLAN_OPTIONS_VERSION_1 = 1  # braid.h: up to plan_yaml
PLAN_OPTIONS_VERSION_2 = 2  # braid.h: schedule, virtual_stages, microbatch_size
SIMULATION_OPTIONS_VERSION = 1  # braid/pipeline.h
REORDER_OPTIONS_VERSION = 1  # braid/data.h
RUN_SETTINGS_VERSION = 2  # braid.h

# braid_vocabulary values (braid/vocabulary.h).
VOCABULARY_STRATEGY = 0
VOCABULARY_SCHEDULE = 1
VOCABULARY_OPCODE = 2
VOCABULARY_BUBBLE_CAUSE = 3
VOCABULARY_REORDERING = 4
VOCABULARY_AXIS = 5
VOCABULARY_BUBBLE_SCHEDULE = 6
VOCABULARY_PRECISION = 7
VOCABULARY_RECOMPUTE = 8
VOCABULARY_ATTENTION = 9

status_t = ctypes.c_int  # braid_status
enum_t = ctypes.c_int  # every C enum (int-sized)
P = ctypes.POINTER


# ---- opaque handles --------------------------------------------------------------------


class _Opaque(ctypes.Structure):
    pass


class ConfigStruct(_Opaque):
    """braid_config"""


class PlanStruct(_Opaque):
    """braid_plan"""


class ProgramStruct(_Opaque):
    """braid_program"""


class SimulationStruct(_Opaque):
    """braid_simulation"""


class ReorderStruct(_Opaque):
    """braid_reorder"""


class BubbleSchedulerStruct(_Opaque):
    """braid_bubble_scheduler"""


class GroupsStruct(_Opaque):
    """braid_groups"""


ConfigPtr = P(ConfigStruct)
PlanPtr = P(PlanStruct)
ProgramPtr = P(ProgramStruct)
SimulationPtr = P(SimulationStruct)
ReorderPtr = P(ReorderStruct)
BubbleSchedulerPtr = P(BubbleSchedulerStruct)
GroupsPtr = P(GroupsStruct)


# ---- braid.h ---------------------------------------------------------------------------


class braid_run_settings(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("global_batch", ctypes.c_int64),
        ("microbatch_size", ctypes.c_int32),
        ("contrastive_batch", ctypes.c_int64),
        ("precision", enum_t),
        ("zero_stage", ctypes.c_int32),
        ("recompute", enum_t),
        ("attention", enum_t),
        ("sequence_parallel", ctypes.c_int32),
        ("schedule", ctypes.c_char_p),
        ("virtual_stages", ctypes.c_int32),
        ("overlap_grad_reduce", ctypes.c_int32),
        ("image_resolution", ctypes.c_int32),
        ("text_tokens", ctypes.c_int32),
        ("audio_tokens", ctypes.c_int32),
        ("generated_image_resolution", ctypes.c_int32),
        ("overlap_param_gather", ctypes.c_int32),
        ("tp_comm_overlap", ctypes.c_int32),
        ("fused_kernels", ctypes.c_int32),
        ("fp8", ctypes.c_int32),
    ]
    _enums_ = {"precision": VOCABULARY_PRECISION, "recompute": VOCABULARY_RECOMPUTE,
               "attention": VOCABULARY_ATTENTION}
    _bools_ = ("sequence_parallel", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "fused_kernels",
               "fp8")


class braid_plan_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("strategy", enum_t),
        ("tp", ctypes.c_int32),
        ("pp", ctypes.c_int32),
        ("dp", ctypes.c_int32),
        ("plan_yaml", ctypes.c_char_p),
        # version 2
        ("schedule", ctypes.c_char_p),
        ("virtual_stages", ctypes.c_int32),
        ("microbatch_size", ctypes.c_int32),
    ]


class braid_module_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("role", ctypes.c_char_p),
        ("devices", ctypes.c_int32),
        ("tp", ctypes.c_int32),
        ("pp", ctypes.c_int32),
        ("dp", ctypes.c_int32),
        ("first_device", ctypes.c_int32),
        ("first_stage", ctypes.c_int32),
        ("microbatch_size", ctypes.c_int32),
        ("stage_count", ctypes.c_int32),
        ("layers_per_stage", P(ctypes.c_int32)),
    ]
    _counts_ = {"layers_per_stage": "stage_count"}


class braid_estimate(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("iteration_time_s", ctypes.c_double),
        ("samples_per_s", ctypes.c_double),
        ("tflops_per_device", ctypes.c_double),
        ("mfu", ctypes.c_double),
        ("peak_memory_gib", ctypes.c_double),
        ("bubble_fraction", ctypes.c_double),
        ("devices", ctypes.c_int32),
    ]


class braid_alternative(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("strategy", enum_t),
        ("feasible", ctypes.c_int32),
        ("iteration_time_s", ctypes.c_double),
        ("reason", ctypes.c_char_p),
    ]
    _enums_ = {"strategy": VOCABULARY_STRATEGY}
    _bools_ = ("feasible",)


# ---- braid/pipeline.h ------------------------------------------------------------------


class braid_stage_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("module", ctypes.c_int32),
        ("replicas", ctypes.c_int32),
        ("devices_per_replica", ctypes.c_int32),
        ("first_device", ctypes.c_int32),
        ("device_stride", ctypes.c_int32),
        ("depth", ctypes.c_int32),
        ("instruction_count", ctypes.c_size_t),
        ("prev_count", ctypes.c_size_t),
        ("prev", P(ctypes.c_int32)),
        ("next_count", ctypes.c_size_t),
        ("next", P(ctypes.c_int32)),
        ("gradient_scale", ctypes.c_double),
        ("part_count", ctypes.c_size_t),
    ]


class braid_stage_part(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("module", ctypes.c_int32),
        ("module_stage", ctypes.c_int32),
        ("first_layer", ctypes.c_int32),
        ("layer_count", ctypes.c_int32),
    ]


class braid_instruction(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("opcode", enum_t),
        ("microbatch", ctypes.c_int32),
        ("chunk", ctypes.c_int32),
        ("peer", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("unit", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
    ]
    _enums_ = {"opcode": VOCABULARY_OPCODE}


class braid_program_rank_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("stage", ctypes.c_int32),
        ("replica", ctypes.c_int32),
        ("tp_rank", ctypes.c_int32),
        ("instruction_count", ctypes.c_size_t),
    ]


class braid_simulation_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("record_trace", ctypes.c_int32),
        ("trace_replicas", ctypes.c_int32),
    ]


class braid_simulation_result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("step_time_s", ctypes.c_double),
        ("bubble_fraction", ctypes.c_double),
        ("bubbles_s", ctypes.c_double * BUBBLE_COUNT),
        ("peak_memory_gib", ctypes.c_double),
        ("mfu", ctypes.c_double),
        ("devices", ctypes.c_int32),
        ("ranks", ctypes.c_int32),
        ("events", ctypes.c_int64),
    ]


class braid_stage_result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("busy_s", ctypes.c_double),
        ("idle_s", ctypes.c_double),
        ("bubbles_s", ctypes.c_double * BUBBLE_COUNT),
        ("peak_memory_gib", ctypes.c_double),
        ("finish_s", ctypes.c_double),
    ]


# ---- braid/groups.h --------------------------------------------------------------------


class braid_group_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("module", ctypes.c_int32),
        ("axis", enum_t),
        ("rank_count", ctypes.c_size_t),
        ("ranks", P(ctypes.c_int32)),
    ]
    _enums_ = {"axis": VOCABULARY_AXIS}


class braid_rank_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("stage", ctypes.c_int32),
        ("replica", ctypes.c_int32),
        ("tp_rank", ctypes.c_int32),
        ("holding_count", ctypes.c_size_t),
    ]


class braid_holding(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("module", ctypes.c_int32),
        ("stage", ctypes.c_int32),
        ("tp", ctypes.c_int32),
        ("dp", ctypes.c_int32),
    ]


class braid_link_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("from_module", ctypes.c_int32),
        ("to_module", ctypes.c_int32),
        ("from_stage", ctypes.c_int32),
        ("to_stage", ctypes.c_int32),
        ("local", ctypes.c_int32),
        ("pair_count", ctypes.c_size_t),
    ]
    _bools_ = ("local",)


class braid_link_pair(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("from_replica", ctypes.c_int32),
        ("to_replica", ctypes.c_int32),
        ("from_rank_count", ctypes.c_size_t),
        ("from_ranks", P(ctypes.c_int32)),
        ("to_rank_count", ctypes.c_size_t),
        ("to_ranks", P(ctypes.c_int32)),
    ]


class braid_batch_sync_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("member_count", ctypes.c_size_t),
        ("rank_count", ctypes.c_size_t),
        ("ranks", P(ctypes.c_int32)),
    ]


class braid_batch_sync_member(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("module", ctypes.c_int32),
        ("stage", ctypes.c_int32),
        ("replica", ctypes.c_int32),
        ("rank_count", ctypes.c_size_t),
        ("ranks", P(ctypes.c_int32)),
    ]


# ---- braid/data.h ----------------------------------------------------------------------


class braid_sample_batch(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("samples", ctypes.c_size_t),
        ("image_resolution", P(ctypes.c_int32)),
        ("text_tokens", P(ctypes.c_int32)),
        ("audio_tokens", P(ctypes.c_int32)),
        ("generated_image_resolution", P(ctypes.c_int32)),
        ("module_costs", P(ctypes.c_double)),
    ]


class braid_reorder_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("reordering", enum_t),
        ("max_evaluations", ctypes.c_int64),
    ]


class braid_reorder_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("samples", ctypes.c_size_t),
        ("cells", ctypes.c_int32),
        ("pipeline_groups", ctypes.c_int32),
        ("microbatches", ctypes.c_int32),
        ("cell_microbatch", ctypes.c_int32),
        ("straggler_before", ctypes.c_double),
        ("straggler_after", ctypes.c_double),
        ("evaluations", ctypes.c_int64),
    ]


# ---- braid/bubble.h --------------------------------------------------------------------


class braid_bubble_report(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("plain_step_s", ctypes.c_double),
        ("coarse_step_s", ctypes.c_double),
        ("fine_step_s", ctypes.c_double),
        ("recovered_coarse", ctypes.c_double),
        ("recovered_fine", ctypes.c_double),
        ("bubbles_before_s", ctypes.c_double * BUBBLE_COUNT),
        ("bubbles_after_s", ctypes.c_double * BUBBLE_COUNT),
        ("scheduler_time_s", ctypes.c_double),
        ("placements", ctypes.c_int32),
        ("encoder_tasks", ctypes.c_int64),
        ("tp_bubble_tasks", ctypes.c_int64),
        ("llm_step_s", ctypes.c_double),
        ("llm_idle_s", ctypes.c_double),
        ("encoder_s", ctypes.c_double),
        ("bubble_filled", ctypes.c_double * 3),  # encoder-first, optimus-coarse, optimus-fine
        ("encoder_hidden", ctypes.c_double * 3),
        ("dp_wait_tasks", ctypes.c_int64),
    ]


# ---- braid/tensor.h --------------------------------------------------------------------

# braid_device_type and braid_dtype_code values (DLPack's).
DEVICE_CPU = 1
DEVICE_CUDA = 2
DTYPE_INT = 0
DTYPE_UINT = 1
DTYPE_FLOAT = 2
DTYPE_BFLOAT = 4
CONTRASTIVE_OPTIONS_VERSION = 1


class braid_device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("index", ctypes.c_int32)]


class braid_dtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class braid_tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", braid_device),
        ("ndim", ctypes.c_int32),
        ("dtype", braid_dtype),
        ("shape", P(ctypes.c_int64)),
        ("strides", P(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class braid_contrastive_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("row_offset", ctypes.c_int64),
        ("tile", ctypes.c_int32),
    ]


def new(struct_type):
    """A zeroed struct with its struct_size set, as the *_INIT macros start it."""
    value = struct_type()
    value.struct_size = ctypes.sizeof(struct_type)
    return value
