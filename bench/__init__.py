"""The benchmarks of a ranksight checkout (not installed). `ranksight bench NAME` runs bench/NAME/."""
