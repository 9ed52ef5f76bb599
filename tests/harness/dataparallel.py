"""Reproduce ``Trainer``'s ``torch.nn.DataParallel`` wrapping without GPUs.

``transformers.Trainer`` wraps the model in ``torch.nn.DataParallel`` whenever ``args.n_gpu > 1`` (a host
with several GPUs and no launcher).  ``n_gpu`` is computed once by ``TrainingArguments._setup_devices``;
overriding the cached ``_n_gpu`` afterwards reproduces the wrapping on CPU, where ``DataParallel`` without
device ids simply calls the wrapped module.  Note that ``train_batch_size`` becomes
``per_device_train_batch_size * n_gpu``, as on a real multi-GPU host.
"""


def force_data_parallel(training_args, n_gpu=2):
    """Make ``Trainer`` see ``n_gpu`` devices (so it wraps the model in DataParallel); returns the args."""
    _ = training_args.device  # runs (and caches) _setup_devices, which sets _n_gpu
    training_args._n_gpu = int(n_gpu)
    return training_args
