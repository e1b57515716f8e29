"""The tokenized corpus and its store: a corpus tokenized once, kept and shared.

  tokenized_corpus  the vocabulary a data config resolves to, the tokenized corpus
                    (TokenizedCorpus) and the in-memory path that tokenizes at every start
  token_store       the store on disk: key, shards, manifest, reading a selection
  corpus_units      the units a corpus is cut into for the store (file ranges, tfds parts)
  prepare_corpus    `python -m data_pipeline.store.prepare_corpus`: tokenize into the store,
                    over a host's cores and a pod's hosts

Imports: `host`, data_pipeline.sources, data_pipeline.vocab, data_pipeline.specs (the
judgement of a config); never data_pipeline.examples.
"""
