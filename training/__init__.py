"""Training, one concept a module; read trainer.py first.

config.py      the config's schemas and every value's check, before any data is read
setup.py       Setup: the run's model, optimizer, device, precision, ranks, data, made once
trainer.py     Trainer: a run's setup and progress, and the loop (fit, train_epoch, train_step, evaluate)
step.py        the loss and one optimizer step (accumulate, clip, update, skip a non-finite step)
schedule.py    the learning rate of each step
validation.py  an evaluation: loss, greedy decoding, BLEU and chrF, images and samples
progress.py    where training stands, and the log line of its steps
stopping.py    when training stops: limits, early stopping, signals, the ranks' agreement
averaging.py   the checkpoints kept beside last.pt, and averages of weights
results.py     the run's end: test weights, test decoding, results.json, the summary
run.py         a run in its folder: prepare and run
resume.py      what a checkpoint must share with the run it resumes; each rank's generators
run_folder.py  the run folder's guards and lock
board.py       TensorBoard: scalars, attention images and the Attention tab's summaries
distributed.py DDP: ranks, process group, collectives
"""
