"""Input benchmarks: what the data path makes, and how fast.

  pipeline            the input rate a slice needs against what tf.data makes per host
  sentence_splitting  the sentence splitters on tests/data/sentence_cases.jsonl
  data_prepare        the tokenized store on 24 MB-1 GB of real text: first and later starts
"""
