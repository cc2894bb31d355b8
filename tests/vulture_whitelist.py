"""Names vulture cannot see used, one group per reason; tests/repo/test_dead_code.py passes this file to vulture.

vulture marks a definition used when its name is read anywhere, so naming ``_.name`` here keeps every definition
called ``name`` alive: add a name only with the reason its group gives, and never to keep code that nothing calls
(delete that). tests/repo/test_dead_code.py also fails on an entry whose name the package no longer defines.

The simulated library's ``nvml*`` entry points are not listed: the test takes them from
:func:`flexmig.sim.entrypoints.entry_points` (pynvml looks each one up by name on the library object).
"""

from typing import Any


class _Used:
    """Any attribute of it is a name vulture counts as read."""

    def __getattr__(self, name: str) -> Any:
        return self


_ = _Used()

# --- Signatures fixed by someone else: asyncio.Protocol callbacks the event loop calls, ``__exit__``'s arguments, and
# the arguments of C entry points the simulator answers without needing them (nvml.h fixes the signature).
_.connection_made
_.data_received
_.connection_lost
_.exc_type
_.addresses  # nvmlDeviceGetRetiredPages(device, cause, count, addresses)
_.scope  # nvmlDeviceGetCpuAffinityWithinScope / nvmlDeviceGetMemoryAffinity(device, size, set, scope)

# --- Set on a paho client for paho to call or read (flexmig.mqtt.command_guard's probe client).
_.connect_timeout
_.on_connect
_.on_publish
_.on_disconnect

# --- The simulated libnvidia-ml, read by pynvml and its callers (nvitop, gpustat, DCGM-style tools), not by flexmig:
# fields of pynvml's ctypes structures the simulator fills (nvml.h names them), the error-string entry point (set on
# the instance, so entry_points() does not list it) and pynvml's module global that install/uninstall reset.
_.bar1Free
_.bar1Total
_.bar1Used
_.bridgeCount
_.bus
_.busIdLegacy
_.computeInstanceId
_.computeInstanceSliceCount
_.copyEngineCount
_.decoderCount
_.deviceMemory
_.domain
_.encoderCount
_.gpuInstance
_.gpuInstanceId
_.gpuInstanceSliceCount
_.isP2pSupported
_.jpegCount
_.l1Cache
_.l2Cache
_.latencyUsec
_.metricInfo
_.ofaCount
_.pciDeviceId
_.pciSubSystemId
_.registerFile
_.sharedCopyEngineCount
_.sharedDecoderCount
_.sharedEncoderCount
_.sharedJpegCount
_.sharedOfaCount
_.temperature
_.uiVal
_.ullVal
_.isC2cEnabled
_.valueType
_.nvmlErrorString
_._nvmlLib_refcount

# --- The simulator's control and ground-truth API (docs/simulator.md): tests and demos drive the simulated node
# with it and check what the daemon did against it; the daemon never calls it.
_.inject_error
_.clear_errors
_.alias_uuid
_.lose_gpu
_.set_privileged
_.gpm_samples_allocated
_.mig_uuids
_.gi_ids
_.mig_device
_.gi_id_at
_.mig_uuid_at
_.fused_slot

# --- Fields of records that describe outside data or a result (a journal row, a parsed trace, Slurm or DCGM row, a
# hook's environment, a reload's outcome, a catalogue entry): kept whole, like the source they mirror, even where no
# caller reads that field today.
_.action_kind  # journal StepEvent, read by the crash tests' on_step callbacks
_.updated_s  # journalled JobRecord
_.needs_restart  # ReloadResult: keys that take effect only after a restart
_.extern  # catalogue Family: exported by prometheus_client, not by flexmig
_.received  # CommandStats counter
_.qos  # trace row
_.unknown_indices  # Slurm demand
_.restart_count  # squeue row
_.gres_used  # sinfo row
_.dynamic  # sinfo node flag (slurmd -Z)
_.tightened_from  # DatabaseCheck: the mode a database file had before it was tightened
_.fb_free_bytes  # DCGM row
_.resume_step  # flexmig_hook.HookEnv: the step a job resumes from (the hook's public API for job scripts)
_.close_by_s  # reregistration Verdict: the latest the node is surely empty by its jobs' limits (the agent reads the
# reservation's start from the same rule, slurm.agent_read.close_at)

# --- Read by tests to observe state that the daemon itself only keeps bounded or acts on (kept: the tests assert the
# bound or the behaviour through them; reading private attributes instead would tie the tests to the internals).
_.size_bytes  # Outbox: bytes of event JSON stored (max_bytes bounds it)
_.tracked  # TelemetryStore: instances with history (bounded)
_.pings  # Watchdog: pings sent
_.ticks  # Watchdog: ticks run
_.renders  # metrics.scrape.Exposition: snapshot parts rendered (the tests and bench/scrape.py count one per snapshot)

# --- Public ends used by tests, the benchmarks and other tools: NotifyReceiver.receive (the service manager's side
# of sd_notify, public in flexmig.sdnotify) and Testbed.sbatch (the Slurm testbed's way to submit a job).
_.receive
_.sbatch

# --- Configuration keys read by name: flexmig.config.settings.build_settings reads each key of a table with
# getattr and sets the settings field its schema entry names (``to``), so a key that only a component's settings
# object carries is read nowhere else.
_.underuse_activity
_.underuse_activity_exit
_.underuse_memory
_.underuse_memory_exit
_.underuse_window_s
_.underuse_exit_window_s
_.oversize_window_s
_.fragmentation_window_s
_.migrate_enabled
_.resplit_enabled
_.malleable_enabled


# --- Public names in a module's ``__all__`` that only tests, benchmarks, docs or job scripts use (vulture counts
# ``__all__`` as a use; tests/repo/test_dead_code.py does not, so that an export nothing needs shows up).
_.demand_from_requests  # flexmig.detect: the demand mix learnt from requests (docs/detection.md)
_.installed  # flexmig.sim: is the simulator under pynvml (docs/simulator.md)
_.simulate  # flexmig.replay.run: one replay (bench/, docs/replay.md)
_.CLIENT_OPTIONS  # flexmig.cli.operation_args: the options the CLI keeps (tests/act/test_operation_table.py)
_.MemorySink  # flexmig.act.events: an event sink that keeps them (bench/migration.py, tests)
_.StepBatchSampler  # flexmig.hook.torch: the hook's torch helpers for job scripts (docs/jobs.md, examples/)
_.load_checkpoint
_.save_checkpoint
_.schema_documents  # flexmig.mqtt.command_schema: generates schemas/command*.json (a test keeps them equal)
_.sample_names  # flexmig.metrics.families: the PromQL names of the catalogue (tests check dashboards and rules)
_.smaller_profile  # flexmig.detect: the smallest profile that fits at one margin (the tests state the rule with it)
_.SnapshotCollector  # flexmig.metrics.collector: the served families as prometheus_client's (tests, bench/scrape.py)
_.build_registry
_.load_pools  # flexmig.replay.synth: synthetic traces (bench/malleable.py, docs/replay.md)
_.carve  # flexmig.plan.carving: the design for one Slurm node per MIG instance, run by bench/slurm_model.py (tests)
_.scenario
_.synthesize
_.write_pod_list
_.PTH_LINE  # flexmig.simenv: the line of flexmig-sim.pth, which setup.py writes (it loads simenv by its path)
_.arm  # flexmig.simenv: what flexmig-sim.pth and flexmig sim exec's sitecustomize call at interpreter start

# --- Not wired in, kept for a decision: flexmig.slurm.slurmd.check_node_conf refuses a [slurm] slurmd_conf word that
# is not KEY=VALUE, but the configuration's checks apply only its Gres= rule; wiring it in would refuse files that
# load today (a behaviour change this clean-up does not make).
_.check_node_conf

# --- The hook's framework integrations: methods the frameworks call by name (a Hugging Face TrainerCallback's
# ``on_*``, a Lightning Callback's hooks) with the arguments their signatures fix, the ``control`` flag the Trainer
# reads, and what job scripts (examples/, not scanned) read from the callbacks and the hook.
_.on_init_end
_.on_train_begin
_.on_step_end
_.on_save
_.should_save
_.on_train_batch_end
_.pl_module
_.batch_idx
_.resume_from_checkpoint
_.ckpt_path
_.trainer_settings
_.dataloader  # flexmig_hook.lightning: the resumable training loader (examples/train_lightning.py)
_.from_standby
_.FlexmigCallback  # flexmig_hook.transformers, flexmig_hook.lightning: one line in a job's callbacks=[...]
_.load_model  # flexmig_hook.dcp: a sharded job's checkpoints (examples/train_fsdp.py, docs/jobs.md)
_.save_model
