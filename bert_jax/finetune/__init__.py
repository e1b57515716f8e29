"""Fine-tuning on downstream tasks: task data readers and the official metrics.

metrics  accuracy / F1 / MCC / Pearson / Spearman, SQuAD EM/F1, entity-level NER scores
glue     the GLUE task table (plus local tasks) and CSV/TSV/JSONL classification readers
squad    SQuAD v1.1/v2.0 reading, feature windows, n-best post-processing
conll    CoNLL-format NER reading, first-sub-token labels, People's Daily NER
"""
