"""`learned_optimization.research.general_lopt.tasks`: the task distributions VeLO was meta-trained on."""
