/* The calls of the handle sweep (tests/test_handles.c), one a line:
 * ROW(kind of the handle h under test, is it a release or close, a name,
 * the call as a result). Included twice: for the thunks, then the table. */

/* arrays */
ROW(H_ARRAY, true, array_release, by_status(ndm_array_release(A)))
ROW(H_ARRAY, false, alias, by_handle(ndm_alias(A).id))
ROW(H_ARRAY, false, add_first, by_handle(ndm_add(A, fx.x).id))
ROW(H_ARRAY, false, add_second, by_handle(ndm_add(fx.x, A).id))
ROW(H_ARRAY, false, reshape, by_handle(ndm_reshape(A, NDM_SHAPE(2)).id))
ROW(H_ARRAY, false, copy, by_handle(ndm_copy(A).id))
ROW(H_ARRAY, false, attach, by_status(ndm_attach(A, fx.m)))
ROW(H_ARRAY, false, detach, by_status(ndm_detach(A)))
ROW(H_ARRAY, false, copy_out, by_status(ndm_array_copy_out(A, (float[2]){0}, 8)))
ROW(H_ARRAY, false, item, by_status(ndm_item(A, &(double){0})))
ROW(H_ARRAY, false, to_dlpack, by_flag(!ndm_to_dlpack(A)))
ROW(H_ARRAY, false, forward_input, by_handle(ndm_forward(fx.net, A).id))
ROW(H_ARRAY, false, predict_input, by_handle(ndm_predict(fx.pred, A).id))
ROW(H_ARRAY, false, array_record_stream, by_status(ndm_array_record_stream(A, fx.s)))

/* managers */
ROW(H_MANAGER, true, manager_close, by_status(ndm_manager_close(M)))
ROW(H_MANAGER, false, manager_new, by_handle(ndm_manager_new(M, "child").id))
ROW(H_MANAGER, false, zeros, by_handle(ndm_zeros(M, NDM_F32, NDM_SHAPE(1)).id))
ROW(H_MANAGER, false, manager_stats, by_status(ndm_manager_stats(M, NDM_CPU, 0, &(ndm_stats){0})))
ROW(H_MANAGER, false, manager_cap, by_status(ndm_manager_cap(M, NDM_CAP_ARRAYS)))
ROW(H_MANAGER, false, manager_parent, by_handle(ndm_manager_parent(M).id))
ROW(H_MANAGER, false, attach_to, by_status(ndm_attach(fx.x, M)))
ROW(H_MANAGER, false, scope_begin, by_handle(ndm_scope_begin(M, "s").id))
ROW(H_MANAGER, false, stream_new, by_status(ndm_stream_new(M, &(ndm_stream){0})))
ROW(H_MANAGER, false, event_new, by_status(ndm_event_new(M, &(ndm_event){0})))
ROW(H_MANAGER, false, linear, by_handle(ndm_linear(M, 2, 2, true, &(ndm_rng){0}).id))
ROW(H_MANAGER, false, sgd_model, by_handle(ndm_sgd(M, fx.net, 0.1, 0, 0).id))
ROW(H_MANAGER, false, predictor_model, by_handle(ndm_predictor_new(M, fx.net).id))
ROW(H_MANAGER, false, forward_to_out, by_handle(ndm_forward_to(M, fx.net, fx.x).id))

/* modules */
ROW(H_MODULE, false, forward, by_handle(ndm_forward(MOD, fx.x).id))
ROW(H_MODULE, false, forward_to, by_handle(ndm_forward_to(fx.m, MOD, fx.x).id))
ROW(H_MODULE, false, module_set_training, by_status(ndm_module_set_training(MOD, true)))
ROW(H_MODULE, false, module_parameters, by_flag(ndm_module_parameters(MOD, NULL, 0) < 0))
ROW(H_MODULE, false, module_named_parameters,
    by_flag(ndm_module_named_parameters(MOD, NULL, NULL, 0) < 0))
ROW(H_MODULE, false, module_named_state, by_flag(ndm_module_named_state(MOD, NULL, NULL, 0) < 0))
ROW(H_MODULE, false, module_describe, by_flag(ndm_module_describe(MOD, NULL, 0) < 0))
ROW(H_MODULE, false, sgd, by_handle(ndm_sgd(fx.m, MOD, 0.1, 0, 0).id))
ROW(H_MODULE, false, adam, by_handle(ndm_adam(fx.m, MOD, 0.1, 0.9, 0.999, 1e-8, 0).id))
ROW(H_MODULE, false, module_save, by_status(ndm_module_save(MOD, fx.path)))
ROW(H_MODULE, false, module_load, by_flag(ndm_module_load(MOD, fx.path, 0) < 0))
ROW(H_MODULE, false, predictor_new, by_handle(ndm_predictor_new(fx.m, MOD).id))
ROW(H_MODULE, false, predictor_load, by_handle(ndm_predictor_load(fx.m, MOD, fx.path).id))

/* optimizers */
ROW(H_OPTIMIZER, false, optimizer_step, by_status(ndm_optimizer_step(OPT)))
ROW(H_OPTIMIZER, false, optimizer_zero_grad, by_status(ndm_optimizer_zero_grad(OPT)))
ROW(H_OPTIMIZER, false, optimizer_set_lr, by_status(ndm_optimizer_set_lr(OPT, 0.1)))
ROW(H_OPTIMIZER, false, optimizer_lr, by_flag(ndm_optimizer_lr(OPT) < 0))
ROW(H_OPTIMIZER, false, optimizer_save, by_status(ndm_optimizer_save(OPT, fx.path)))
ROW(H_OPTIMIZER, false, optimizer_load, by_status(ndm_optimizer_load(OPT, fx.path)))

/* predictors */
ROW(H_PREDICTOR, false, predict, by_handle(ndm_predict(PRED, fx.x).id))
ROW(H_PREDICTOR, false, predict_to, by_handle(ndm_predict_to(fx.m, PRED, fx.x).id))
ROW(H_PREDICTOR, false, predictor_manager, by_handle(ndm_predictor_manager(PRED).id))

/* loaders */
ROW(H_LOADER, true, loader_close, by_status(ndm_loader_close(LD)))
ROW(H_LOADER, false, loader_next, by_flag(ndm_loader_next(LD, &(ndm_batch){0}) < 0))
ROW(H_LOADER, false, loader_keep, by_status(ndm_loader_keep(LD)))
ROW(H_LOADER, false, loader_set_epoch, by_status(ndm_loader_set_epoch(LD, 0)))
ROW(H_LOADER, false, loader_batches, by_flag(ndm_loader_batches(LD) < 0))

/* streams */
ROW(H_STREAM, true, stream_release, by_status(ndm_stream_release(S)))
ROW(H_STREAM, false, stream_device, by_flag((ndm_stream_device(S), ndm_last_status() < 0)))
ROW(H_STREAM, false, stream_synchronize, by_status(ndm_stream_synchronize(S)))
ROW(H_STREAM, false, stream_query, by_status(ndm_stream_query(S, &(bool){0})))
ROW(H_STREAM, false, stream_set_current, by_status(ndm_stream_set_current(S)))
ROW(H_STREAM, false, stream_wait_event, by_status(ndm_stream_wait_event(S, fx.e)))
ROW(H_STREAM, false, event_record_on, by_status(ndm_event_record(fx.e, S)))
ROW(H_STREAM, false, record_stream, by_status(ndm_array_record_stream(fx.x, S)))

/* events */
ROW(H_EVENT, true, event_release, by_status(ndm_event_release(E)))
ROW(H_EVENT, false, stream_wait_on, by_status(ndm_stream_wait_event(fx.s, E)))
ROW(H_EVENT, false, event_record, by_status(ndm_event_record(E, fx.s)))
ROW(H_EVENT, false, event_query, by_status(ndm_event_query(E, &(bool){0})))
ROW(H_EVENT, false, event_synchronize, by_status(ndm_event_synchronize(E)))

/* data-parallel wrappers (made only under MPI: no stale one here) */
ROW(H_DDP, true, ddp_close, by_status(ndm_ddp_close(D)))
ROW(H_DDP, false, ddp_backward, by_status(ndm_ddp_backward(D, fx.x)))
ROW(H_DDP, false, ddp_step, by_status(ndm_ddp_step(D)))
ROW(H_DDP, false, ddp_buckets, by_flag(ndm_ddp_buckets(D) < 0))
