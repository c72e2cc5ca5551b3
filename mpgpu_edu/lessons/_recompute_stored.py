"""Lesson 09's recomputation and accumulation study, simulated once: ``memory_for_time.
recompute_rows`` reads these instead of simulating GPT-2 medium twelve times (about 13 s) each
time the notebook runs.

Keys are ``memory_for_time.recompute_key``; values ``recompute_rows(..., stored=False)``'s
rows. ``tests/test_lessons_memory_for_time.py`` holds them to a fresh simulation. Regenerate
after a change to the simulator, the presets or the models:
``python -m mpgpu_edu.lessons.memory_for_time --recompute``.
"""

ROWS = {
    'gpt2-medium|8xA100-nvlink|32|1024|1,2,4,8': [
        {
            'recompute': 'none',
            'accumulate': 1,
            'step_s': 0.6909471569270279,
            'activations': 98559983616,
            'total': 104237154304,
            'capacity': 85899345920,
            'fits': False,
        },
        {
            'recompute': 'none',
            'accumulate': 2,
            'step_s': 0.6933771569270285,
            'activations': 49279991808,
            'total': 54957162496,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'none',
            'accumulate': 4,
            'step_s': 0.6982371569270276,
            'activations': 24639995904,
            'total': 30317166592,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'none',
            'accumulate': 8,
            'step_s': 0.7079571569270262,
            'activations': 12319997952,
            'total': 17997168640,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'selective',
            'accumulate': 1,
            'step_s': 0.7519125269536946,
            'activations': 34135474176,
            'total': 39812644864,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'selective',
            'accumulate': 2,
            'step_s': 0.7544625269536951,
            'activations': 17067737088,
            'total': 22744907776,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'selective',
            'accumulate': 4,
            'step_s': 0.7595625269536951,
            'activations': 8533868544,
            'total': 14211039232,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'selective',
            'accumulate': 8,
            'step_s': 0.7697625269536937,
            'activations': 4266934272,
            'total': 9944104960,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'full',
            'accumulate': 1,
            'step_s': 0.891085891123162,
            'activations': 8365670400,
            'total': 14042841088,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'full',
            'accumulate': 2,
            'step_s': 0.894715891123162,
            'activations': 4182835200,
            'total': 9860005888,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'full',
            'accumulate': 4,
            'step_s': 0.9019758911231629,
            'activations': 2091417600,
            'total': 7768588288,
            'capacity': 85899345920,
            'fits': True,
        },
        {
            'recompute': 'full',
            'accumulate': 8,
            'step_s': 0.9164958911231599,
            'activations': 1045708800,
            'total': 6722879488,
            'capacity': 85899345920,
            'fits': True,
        },
    ],
}
