#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# Prints, one per line as NAME=value (or NAME unset), every variable ddprun promises its ranks.
# Used by tests/test_ddprun.sh to check the launcher's environment contract.
for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK \
         ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT \
         TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE \
         TORCH_NCCL_ASYNC_ERROR_HANDLING OMP_NUM_THREADS DDP_JOB_SECRET; do
    if eval "[ -n \"\${$v+set}\" ]"; then
        eval "echo \"$v=\$$v\""
    else
        echo "$v unset"
    fi
done
