"""BibTeX entries of the papers the zoo cites (keyed by the `paper_ids` of the model configs), for the model cards.

Long author lists end in `and others`; the arXiv id identifies each paper exactly.
"""

from __future__ import annotations

__all__ = ["PAPERS", "bibtex"]

# arXiv id -> (BibTeX key, title, authors, year, venue)
PAPERS: dict[str, tuple[str, str, str, int, str]] = {
    "2012.12877": (
        "touvron2021deit",
        "Training data-efficient image transformers \\& distillation through attention",
        "Touvron, Hugo and Cord, Matthieu and Douze, Matthijs and Massa, Francisco and Sablayrolles, Alexandre "
        "and J{\\'e}gou, Herv{\\'e}",
        2021,
        "ICML",
    ),
    "2403.13298": (
        "heo2024ropevit",
        "Rotary Position Embedding for Vision Transformer",
        "Heo, Byeongho and Park, Song and Han, Dongyoon and Yun, Sangdoo",
        2024,
        "ECCV",
    ),
    "2508.10104": (
        "simeoni2025dinov3",
        "DINOv3",
        "Sim{\\'e}oni, Oriane and Vo, Huy V. and Seitzer, Maximilian and Baldassarre, Federico and Oquab, Maxime "
        "and others",
        2025,
        "",
    ),
    "2107.14222": (
        "wu2021irpe",
        "Rethinking and Improving Relative Position Encoding for Vision Transformer",
        "Wu, Kan and Peng, Houwen and Chen, Minghao and Fu, Jianlong and Chao, Hongyang",
        2021,
        "ICCV",
    ),
    "2102.10882": (
        "chu2023cpe",
        "Conditional Positional Encodings for Vision Transformers",
        "Chu, Xiangxiang and Tian, Zhi and Zhang, Bo and Wang, Xinlong and Shen, Chunhua",
        2023,
        "ICLR",
    ),
    "2107.00652": (
        "dong2022cswin",
        "CSWin Transformer: A General Vision Transformer Backbone with Cross-Shaped Windows",
        "Dong, Xiaoyi and Bao, Jianmin and Chen, Dongdong and Zhang, Weiming and Yu, Nenghai and Yuan, Lu "
        "and Chen, Dong and Guo, Baining",
        2022,
        "CVPR",
    ),
    "2403.18361": (
        "fan2024vitar",
        "ViTAR: Vision Transformer with Any Resolution",
        "Fan, Qihang and You, Quanzeng and Han, Xiaotian and Liu, Yongfei and Tao, Yunzhe and Huang, Huaibo "
        "and He, Ran and Yang, Hongxia",
        2024,
        "",
    ),
    "2103.15691": (
        "arnab2021vivit",
        "ViViT: A Video Vision Transformer",
        "Arnab, Anurag and Dehghani, Mostafa and Heigold, Georg and Sun, Chen and Lu{\\v{c}}i{\\'c}, Mario "
        "and Schmid, Cordelia",
        2021,
        "ICCV",
    ),
    "2409.12191": (
        "wang2024qwen2vl",
        "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution",
        "Wang, Peng and Bai, Shuai and Tan, Sinan and Wang, Shijie and Fan, Zhihao and Bai, Jinze and others",
        2024,
        "",
    ),
    "2502.05173": (
        "wei2025videorope",
        "VideoRoPE: What Makes for Good Video Rotary Position Embedding?",
        "Wei, Xilin and Liu, Xiaoran and Zang, Yuhang and Dong, Xiaoyi and others",
        2025,
        "ICML",
    ),
    "2502.11664": (
        "liu2025vrope",
        "VRoPE: Rotary Position Embedding for Video Large Language Models",
        "Liu, Zikang and Guo, Longteng and Tang, Yepeng and others",
        2025,
        "",
    ),
    "2412.09616": (
        "ge2024v2pe",
        "V2PE: Improving Multimodal Long-Context Capability of Vision-Language Models with Variable Visual "
        "Position Encoding",
        "Ge, Junqi and Chen, Ziyi and Lin, Jintao and Zhu, Jinguo and others",
        2024,
        "",
    ),
    "2406.10322": (
        "ostmeier2025liere",
        "LieRE: Lie Rotational Positional Encodings",
        "Ostmeier, Sophie and Axelrod, Brian and Varma, Maya and Moseley, Michael and Chaudhari, Akshay S "
        "and Langlotz, Curtis",
        2025,
        "ICML",
    ),
    "2506.03737": (
        "yu2025comrope",
        "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by Trainable Commuting Angle Matrices",
        "Yu, Hao and Jiang, Tangyu and Jia, Shuning and Yan, Shannan and Liu, Shunning and Qian, Haolong and others",
        2025,
        "CVPR",
    ),
    "2511.21631": (
        "bai2025qwen3vl",
        "Qwen3-VL Technical Report",
        "Bai, Shuai and Cai, Yuxuan and Chen, Ruizhe and Chen, Keqin and others",
        2025,
        "",
    ),
    "2505.20444": (
        "li2025hope",
        "HoPE: Hybrid of Position Embedding for Length Generalization in Vision-Language Models",
        "Li, Haoran and others",
        2025,
        "NeurIPS",
    ),
    "2405.13985": (
        "fuller2024lookhere",
        "LookHere: Vision Transformers with Directed Attention Generalize and Extrapolate",
        "Fuller, Anthony and Kyrollos, Daniel G. and Yassin, Yousef and Green, James R.",
        2024,
        "NeurIPS",
    ),
    "2311.00566": (
        "fuller2023croma",
        "CROMA: Remote Sensing Representations with Contrastive Radar-Optical Masked Autoencoders",
        "Fuller, Anthony and Millard, Koreen and Green, James R.",
        2023,
        "NeurIPS",
    ),
    "2310.04418": (
        "li2024fire",
        "Functional Interpolation for Relative Positions Improves Long Context Transformers",
        "Li, Shanda and You, Chong and Guruganesh, Guru and Ainslie, Joshua and Ontanon, Santiago and Zaheer, Manzil "
        "and Sanghai, Sumit and Yang, Yiming and Kumar, Sanjiv and Bhojanapalli, Srinadh",
        2024,
        "ICLR",
    ),
    "2104.09864": (
        "su2021roformer",
        "RoFormer: Enhanced Transformer with Rotary Position Embedding",
        "Su, Jianlin and Lu, Yu and Pan, Shengfeng and Murtadha, Ahmed and Wen, Bo and Liu, Yunfeng",
        2021,
        "Neurocomputing (2024)",
    ),
    "2103.14030": (
        "liu2021swin",
        "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
        "Liu, Ze and Lin, Yutong and Cao, Yue and Hu, Han and Wei, Yixuan and Zhang, Zheng and Lin, Stephen "
        "and Guo, Baining",
        2021,
        "ICCV",
    ),
    "2103.15808": (
        "wu2021cvt",
        "CvT: Introducing Convolutions to Vision Transformers",
        "Wu, Haiping and Xiao, Bin and Codella, Noel and Liu, Mengchen and Dai, Xiyang and Yuan, Lu and Zhang, Lei",
        2021,
        "ICCV",
    ),
}


def bibtex(paper_ids: str) -> str | None:
    """A BibTeX @misc entry for 'arXiv:XXXX.XXXXX'; None for an id this table does not know."""
    arxiv = paper_ids.removeprefix("arXiv:").strip()
    if arxiv not in PAPERS:
        return None
    key, title, authors, year, venue = PAPERS[arxiv]
    fields = [
        f"  title = {{{title}}}",
        f"  author = {{{authors}}}",
        f"  year = {{{year}}}",
        f"  eprint = {{{arxiv}}}",
        "  archivePrefix = {arXiv}",
    ]
    if venue:
        fields.append(f"  note = {{{venue}}}")
    return f"@misc{{{key},\n" + ",\n".join(fields) + "\n}"
