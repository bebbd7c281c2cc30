"""Helpers of the stager tests: a DCP save through ferry.torch.Stager while training goes on."""

import ferry.torch
import torch
import torch.distributed.checkpoint as dcp


def async_save_supports_staging_futures():
    """Whether this torch's dcp.async_save accepts a Future from stage() (it has AsyncSaveResponse)."""
    from torch.distributed.checkpoint import state_dict_saver

    return hasattr(state_dict_saver, "AsyncSaveResponse")


def save_while_training(model, state_dict, path, async_staging):
    """dcp.async_save of state_dict to path through a Stager; once staging is complete and before the upload ends,
    training goes on (the model's parameters are zeroed): the checkpoint must not see it."""
    with ferry.torch.Stager(async_staging=async_staging) as stager:
        response = dcp.async_save(state_dict, checkpoint_id=str(path), async_stager=stager)
        if async_staging:
            response.staging_completion.result()
            upload = response.upload_completion
        else:
            upload = response
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        upload.result()
