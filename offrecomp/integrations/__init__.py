"""offrecomp in the trainers people already use. Each module imports its framework, so
import only the one you need (``import offrecomp`` imports none of them):

- :mod:`offrecomp.integrations.transformers`: ``OffrecompCallback`` for the Hugging Face
  ``Trainer`` (and TRL's trainers built on it).
- :mod:`offrecomp.integrations.lightning`: ``OffrecompCallback`` for PyTorch Lightning.

torchtune recipes and Accelerate scripts need no integration: wrap the training loop in
``offrecomp.runtime(model)``, as docs/integrations.md shows.
"""
