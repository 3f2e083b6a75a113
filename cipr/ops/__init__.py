"""Operations around a run: launching processes (`launch`) and preemption (`preemption`).

`launch` imports nothing heavy; `preemption` needs transformers. The one name both need lives here.
"""

NOTICE_ENV = "CIPR_PREEMPT_FILE"  # the preemption notice file's path, set by slurm/common.sh or launch
