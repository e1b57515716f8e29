"""The example path: sentence pairs, masking and the tf.data input of pretraining.

  pairs         NSP / SOP pairs and RoBERTa packing on a tokenized corpus (numpy)
  documents     whole documents packed by best fit, each attending to itself (numpy)
  masking_spec  what a masking setting is and means (no TensorFlow)
  selection     which positions are predicted and corrupted: token, whole word, span
  masking       mask_tokens: the budget, the selection, one corruption step (tf.data)
  pretraining   PretrainingInput: pairs, masks and batches, resumable; the held-out set

Imports: `host`, data_pipeline.store (the tokenized corpus), data_pipeline.sources,
data_pipeline.specs.
"""
