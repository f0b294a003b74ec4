/* Bounds the whole library shares: the manager's accounting and the layers
 * above the operations size their per-device tables by them. */
#ifndef NDM_BASE_LIMITS_H
#define NDM_BASE_LIMITS_H

/* CUDA devices a process addresses; accounting slots: 0 is the CPU, 1 + i
 * is CUDA device i. */
#define NDM__MAX_CUDA 16

#endif
