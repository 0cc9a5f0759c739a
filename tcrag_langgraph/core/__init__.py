"""What every method uses: the run kernel, configuration, events, the run's input and result, who a run
acts for, answer formats and the shared state records. Nothing here belongs to one method."""
