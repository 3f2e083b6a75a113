"""Studies, above evaluation and training: one engine (`study`) trains every point of a spec (`spec`) as a
cipr-train run, reads it on calibration items (`items`) and with cipr-eval, and reports with intervals
(`study_report`, `stats`); reports written before the engine keep their analyses (`dose_analysis`,
`transfer_analysis`, `evidence`, `ladder`). `cipr-study`, docs/studies.md.
"""
