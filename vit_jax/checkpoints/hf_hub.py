"""``hf-hub:ORG/NAME[@REVISION]``: a timm or transformers folder on the Hugging Face Hub, fetched
into (or found in, offline) the ``huggingface_hub`` cache. No jax here: a command resolves its
Hub ids before it starts jax, so an uncached id offline is one line at once."""

from __future__ import annotations

import re

from vit_jax.base import errors

HUB_PREFIX = 'hf-hub:'
CONFIG = 'config.json'
WEIGHTS = 'model.safetensors'
WEIGHTS_INDEX = 'model.safetensors.index.json'
PREPROCESSOR = 'preprocessor_config.json'  # transformers' image processor.
_HUB_FILES = [CONFIG, '*.safetensors', WEIGHTS_INDEX, PREPROCESSOR]
_REPO_ID = re.compile(r'^[\w.-]+/[\w.-]+$')


def is_hub_id(source: str) -> bool:
  return str(source).startswith(HUB_PREFIX)


def resolve(source: str) -> str:
  """The local folder of ``hf-hub:ORG/NAME[@REVISION]`` in the ``huggingface_hub`` cache,
  downloaded there first unless it is cached and ``HF_HUB_OFFLINE=1`` (or no network): the
  client's own cache, ``HF_HOME`` / ``HF_HUB_CACHE`` and token apply."""
  repo, _, revision = str(source)[len(HUB_PREFIX):].partition('@')
  if not _REPO_ID.match(repo):
    raise errors.ConfigError(f'{source} is not a Hub id: write hf-hub:ORG/NAME (e.g. '
                             'hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k), '
                             'optionally @REVISION.')
  import huggingface_hub
  from huggingface_hub import errors as hub_errors

  try:
    return huggingface_hub.snapshot_download(repo, revision=revision or None,
                                             allow_patterns=_HUB_FILES)
  except hub_errors.LocalEntryNotFoundError:
    from huggingface_hub import constants

    raise errors.MissingFileError(
        f'{source} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and cannot be '
        'downloaded (offline: HF_HUB_OFFLINE=1 or no network). Download it where there is a '
        'network (hf download ' + repo + '), or set HF_HOME to its cache.'
    ) from None
  except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError,
          hub_errors.GatedRepoError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.MissingFileError(f'{source}: {first} (a private or gated repository needs a '
                                  'token: hf auth login, or HF_TOKEN).') from None
