"""The papers visionpe implements or cites: one row per paper, read by the PE presets (`pos/presets.py`), the model
families and the published weights (`paper_ids` / `paper_name` / `origin_url` of the pretrained cfgs), the
benchmark's claims (`visionpe.bench.claims`) and the model cards' BibTeX. Adding a PE with a paper is one `Paper(...)`
row here, naming the presets it introduces; a backbone's paper names the model family its architecture is.

A claim is an ordering a benchmark can judge on its own numbers: (better PE, worse PE) pairs of preset names as in
model names, and where the ordering is meant to hold ("beyond": larger than the training size or clip length;
"base": at the training point; "all"), optionally only under some evaluation protocols. Long author lists end in
`and others`; the arXiv id identifies each paper exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Claim", "Paper", "PAPERS", "CLAIMS", "paper", "preset_papers", "family_paper", "bibtex"]


@dataclass(frozen=True)
class Claim:
    text: str  # the claim in the papers' terms
    pairs: tuple[tuple[str, str], ...]  # (PE expected better or equal, PE expected worse), as in model names
    where: str  # "beyond", "base" or "all"
    protocols: tuple[str, ...] = ()  # only these evaluation protocols (empty: all)
    detail: str = ""  # where in the paper, e.g. "multi-resolution figure"
    source: str = ""  # filled from the paper: "Heo et al., <title> (ECCV 2024)"


@dataclass(frozen=True)
class Paper:
    """One paper: arXiv id, title, official code, BibTeX fields, the presets it introduces and its claims."""

    arxiv: str
    title: str
    code: str = ""
    authors: str = ""
    year: int = 0
    venue: str = ""
    key: str = ""  # BibTeX key
    presets: tuple[str, ...] = ()
    claims: tuple[Claim, ...] = ()
    family: str = ""  # the model family (visionpe.models) whose architecture this paper is, e.g. "swin"
    family_name: str = ""  # the paper's name in that family's pretrained cfgs, where it is not the title

    def cfg(self, origin: bool = False) -> dict:
        """The timm pretrained-cfg fields of this paper; `origin`: also its official code as the `origin_url`."""
        return dict(paper_ids=f"arXiv:{self.arxiv}", paper_name=self.title) | (
            dict(origin_url=self.code) if origin and self.code else {}
        )

    def family_cfg(self) -> dict:
        """The pretrained-cfg fields of the family whose architecture this paper is: its name there and its code."""
        return self.cfg(origin=True) | dict(paper_name=self.family_name or self.title)

    def cite(self) -> str:
        """'Heo et al., Rotary Position Embedding for Vision Transformer (ECCV 2024)'."""
        surname = self.authors.split(",")[0] if self.authors else "?"
        names = self.authors.split(" and ")
        who = surname if len(names) == 1 else f"{surname} and {names[1].split(',')[0]}" if len(names) == 2 else None
        when = " ".join(x for x in (self.venue.split(" (")[0], str(self.year)) if x)
        return f"{who or surname + ' et al.'}, {self.title} ({when})"

    def bibtex(self) -> str:
        """A BibTeX @misc entry."""
        title = self.title.replace("&", "\\&")
        fields = [f"  title = {{{title}}}", f"  author = {{{self.authors}}}", f"  year = {{{self.year}}}"]
        fields += [f"  eprint = {{{self.arxiv}}}", "  archivePrefix = {arXiv}"]
        if self.venue:
            fields.append(f"  note = {{{self.venue}}}")
        return f"@misc{{{self.key},\n" + ",\n".join(fields) + "\n}"


_ROWS = (
    # ------------------------------------------------------------------------------------------------ backbones
    Paper("2012.12877", "Training data-efficient image transformers & distillation through attention", "",
          "Touvron, Hugo and Cord, Matthieu and Douze, Matthijs and Massa, Francisco and Sablayrolles, Alexandre "
          "and J{\\'e}gou, Herv{\\'e}", 2021, "ICML", "touvron2021deit", family="vit",
          family_name="Training data-efficient image transformers"),
    Paper("2106.10270", "How to train your ViT? Data, Augmentation, and Regularization in Vision Transformers", "",
          "Steiner, Andreas and Kolesnikov, Alexander and Zhai, Xiaohua and Wightman, Ross and Uszkoreit, Jakob "
          "and Beyer, Lucas", 2022, "TMLR", "steiner2022augreg"),
    Paper("2103.14030", "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
          "https://github.com/microsoft/Swin-Transformer",
          "Liu, Ze and Lin, Yutong and Cao, Yue and Hu, Han and Wei, Yixuan and Zhang, Zheng and Lin, Stephen "
          "and Guo, Baining", 2021, "ICCV", "liu2021swin", presets=("rpb",), family="swin"),
    Paper("2103.15808", "CvT: Introducing Convolutions to Vision Transformers", "https://github.com/leoxiaobin/CvT",
          "Wu, Haiping and Xiao, Bin and Codella, Noel and Liu, Mengchen and Dai, Xiyang and Yuan, Lu and Zhang, Lei",
          2021, "ICCV", "wu2021cvt", family="cvt"),
    Paper("2103.15691", "ViViT: A Video Vision Transformer", "",
          "Arnab, Anurag and Dehghani, Mostafa and Heigold, Georg and Sun, Chen and Lu{\\v{c}}i{\\'c}, Mario "
          "and Schmid, Cordelia", 2021, "ICCV", "arnab2021vivit", family="vivit"),
    Paper("2104.09864", "RoFormer: Enhanced Transformer with Rotary Position Embedding", "",
          "Su, Jianlin and Lu, Yu and Pan, Shengfeng and Murtadha, Ahmed and Wen, Bo and Liu, Yunfeng", 2021,
          "Neurocomputing (2024)", "su2021roformer", family="mm",
          family_name="RoFormer: Enhanced Transformer with Rotary Position Embedding (1D RoPE)"),
    # ------------------------------------------------------------------------------------------- image PEs
    Paper("2403.13298", "Rotary Position Embedding for Vision Transformer", "https://github.com/naver-ai/rope-vit",
          "Heo, Byeongho and Park, Song and Han, Dongyoon and Yun, Sangdoo", 2024, "ECCV", "heo2024ropevit",
          presets=("rope2d", "rope2d_mixed", "rope2d_ape", "rope2d_mixed_ape"),
          claims=(Claim("RoPE-Mixed >= RoPE-Axial >= APE beyond the training resolution",
                        (("rope2d_mixed", "rope2d"), ("rope2d", "ape")), "beyond",
                        detail="multi-resolution figure"),)),
    Paper("2508.10104", "DINOv3", "https://github.com/facebookresearch/dinov3",
          "Sim{\\'e}oni, Oriane and Vo, Huy V. and Seitzer, Maximilian and Baldassarre, Federico and Oquab, Maxime "
          "and others", 2025, "", "simeoni2025dinov3", presets=("rope2d_dinov3", "rope2d_dinov3_aug"),
          claims=(Claim("RoPE box jittering (coordinate rescaling in training) helps RoPE beyond the training "
                        "resolution", (("rope2d_dinov3_aug", "rope2d_dinov3"),), "beyond"),)),
    Paper("2102.10882", "Conditional Positional Encodings for Vision Transformers",
          "https://github.com/Meituan-AutoML/CPVT",
          "Chu, Xiangxiang and Tian, Zhi and Zhang, Bo and Wang, Xinlong and Shen, Chunhua", 2023, "ICLR",
          "chu2023cpe", presets=("cpe", "cpe_gap"),
          claims=(Claim("PEG (conditional PE) > no PE", (("cpe", "nope"),), "all"),)),
    Paper("2107.14222", "Rethinking and Improving Relative Position Encoding for Vision Transformer",
          "https://github.com/microsoft/Cream/tree/main/iRPE",
          "Wu, Kan and Peng, Houwen and Chen, Minghao and Fu, Jianlong and Chao, Hongyang", 2021, "ICCV",
          "wu2021irpe", presets=("irpe", "irpe_bias", "irpe_qkv", "irpe_k"),
          claims=(Claim("iRPE > APE", (("irpe", "ape"),), "all"),)),
    Paper("2107.00652", "CSWin Transformer: A General Vision Transformer Backbone with Cross-Shaped Windows",
          "https://github.com/microsoft/CSWin-Transformer",
          "Dong, Xiaoyi and Bao, Jianmin and Chen, Dongdong and Zhang, Weiming and Yu, Nenghai and Yuan, Lu "
          "and Chen, Dong and Guo, Baining", 2022, "CVPR", "dong2022cswin", presets=("lepe",)),
    Paper("2403.18361", "ViTAR: Vision Transformer with Any Resolution", "",
          "Fan, Qihang and You, Quanzeng and Han, Xiaotian and Liu, Yongfei and Tao, Yunzhe and Huang, Huaibo "
          "and He, Ran and Yang, Hongxia", 2024, "", "fan2024vitar", presets=("fuzzy", "fuzzy_atm")),
    Paper("2406.10322", "LieRE: Lie Rotational Positional Encodings", "https://github.com/StanfordMIMI/LieRE",
          "Ostmeier, Sophie and Axelrod, Brian and Varma, Maya and Moseley, Michael and Chaudhari, Akshay S "
          "and Langlotz, Curtis", 2025, "ICML", "ostmeier2025liere", presets=("liere",),
          claims=(Claim("LieRE >= 2D RoPE beyond the training resolution", (("liere", "rope2d"),), "beyond"),
                  Claim("LieRE >= 3D RoPE on video", (("liere", "rope3d"),), "all", ("frames", "duration"),
                        detail="3D classification, abstract: +1% over the baselines"))),
    Paper("2506.03737",
          "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by Trainable Commuting Angle Matrices",
          "https://github.com/Longin-Yu/ComRoPE",
          "Yu, Hao and Jiang, Tangyu and Jia, Shuning and Yan, Shannan and Liu, Shunning and Qian, Haolong and others",
          2025, "CVPR", "yu2025comrope", presets=("comrope_ap", "comrope_ld"),
          claims=(Claim("ComRoPE >= LieRE >= RoPE beyond the training resolution",
                        (("comrope_ap", "liere"), ("comrope_ld", "liere"), ("liere", "rope2d"), ("liere", "rope3d")),
                        "beyond", detail="Table 1 (2D); on video the RoPE is 3D RoPE"),)),
    Paper("2502.02562", "Learning the RoPEs: Better 2D and 3D Position Encodings with STRING", "",
          "Schenck, Connor and Reid, Isaac and Jacob, Mithun George and Bewley, Alex and Ainslie, Joshua "
          "and others", 2025, "ICML", "schenck2025string", presets=("string_cayley", "string_circulant"),
          claims=(Claim("STRING > APE on ImageNet (the top-two ViTs are STRINGs, > 1% over APE)",
                        (("string_cayley", "ape"), ("string_circulant", "ape")), "base", detail="section 4, ImageNet"),
                  Claim("Cayley-STRING >= RoPE (ImageNet, and RoPE-Mixed is the STRING with P = I)",
                        (("string_cayley", "rope2d_mixed"), ("string_cayley", "rope2d")), "base",
                        detail="section 4, ImageNet"))),
    Paper("2602.03227", "Spiral RoPE: Rotate Your Rotary Positional Embeddings in the 2D Plane",
          "https://github.com/huajianduzhuo-code/Spiral_RoPE",
          "Liu, Haoyu and Ren, Sucheng and Zhu, Tingyu and Wang, Peng and Xie, Cihang and Yuille, Alan "
          "and others", 2026, "", "liu2026spiralrope", presets=("rope2d_spiral", "rope2d_spiral_ape"),
          claims=(Claim("Spiral RoPE > axial 2D RoPE in classification",
                        (("rope2d_spiral", "rope2d"), ("rope2d_spiral_ape", "rope2d_ape")), "base",
                        detail="abstract: consistent gains in classification, segmentation and generation"),)),
    Paper("2405.13985", "LookHere: Vision Transformers with Directed Attention Generalize and Extrapolate",
          "https://github.com/GreenCUBIC/lookhere",
          "Fuller, Anthony and Kyrollos, Daniel G. and Yassin, Yousef and Green, James R.", 2024, "NeurIPS",
          "fuller2024lookhere", presets=("lookhere", "lookhere_90", "lookhere_45"),
          claims=(Claim("LookHere > 2D RoPE beyond the training resolution",
                        (("lookhere", "rope2d"), ("lookhere_90", "rope2d"), ("lookhere_45", "rope2d")), "beyond"),)),
    Paper("2311.00566", "CROMA: Remote Sensing Representations with Contrastive Radar-Optical Masked Autoencoders",
          "https://github.com/antofuller/CROMA", "Fuller, Anthony and Millard, Koreen and Green, James R.", 2023,
          "NeurIPS", "fuller2023croma", presets=("alibi2d",),
          claims=(Claim("2D ALiBi > RoPE beyond the training resolution", (("alibi2d", "rope2d"),), "beyond"),)),
    Paper("2310.04418", "Functional Interpolation for Relative Positions Improves Long Context Transformers", "",
          "Li, Shanda and You, Chong and Guruganesh, Guru and Ainslie, Joshua and Ontanon, Santiago and Zaheer, Manzil "
          "and Sanghai, Sumit and Yang, Yiming and Kumar, Sanjiv and Bhojanapalli, Srinadh", 2024, "ICLR",
          "li2024fire", presets=("fire2d",),
          claims=(Claim("FIRE > RoPE beyond the training resolution", (("fire2d", "rope2d"),), "beyond",
                        detail="for ViTs as measured by a later study: 63.1% against 18.9% at 4.57x"),)),
    Paper("2106.02795", "Learnable Fourier Features for Multi-Dimensional Spatial Positional Encoding", "",
          "Li, Yang and Si, Si and Li, Gang and Hsieh, Cho-Jui and Bengio, Samy", 2021, "NeurIPS", "li2021lff",
          presets=("lff",),
          claims=(Claim("Learnable Fourier features > learned APE and 2D sin-cos", (("lff", "ape"), ("lff", "sincos")),
                        "base", detail="abstract: outperforms existing PEs in accuracy (ViT classification among "
                        "the tasks)"),)),
    Paper("2506.13277", "SeqPE: Transformer with Sequential Position Encoding", "https://github.com/ghrua/seqpe",
          "Li, Huayang and Liu, Yahui and Sun, Hongyu and Cai, Deng and Cui, Leyang and Bi, Wei and Zhao, Peilin and "
          "Watanabe, Taro", 2025, "", "li2025seqpe", presets=("seqpe",),
          claims=(Claim("SeqPE > learned APE and 2D RoPE beyond the training resolution",
                        (("seqpe", "ape"), ("seqpe", "rope2d")), "beyond",
                        detail="abstract: better accuracy, particularly under extrapolation (ImageNet-1k ViT, "
                        "224 px trained, up to 672 px); the table's numbers are unverified here"),)),
    # its CPE-vs-plain-APE ablation could not be read: no claim
    Paper("2312.06709", "AM-RADIO: Agglomerative Vision Foundation Model -- Reduce All Domains Into One",
          "https://github.com/NVlabs/RADIO",
          "Ranzinger, Mike and Heinrich, Greg and Kautz, Jan and Molchanov, Pavlo", 2024, "CVPR", "ranzinger2024radio",
          presets=("ape_radio",)),
    Paper("2309.00071", "YaRN: Efficient Context Window Extension of Large Language Models", "",
          "Peng, Bowen and Quesnelle, Jeffrey and Fan, Honglu and Shippole, Enrico", 2024, "ICLR", "peng2024yarn"),
    Paper("2410.06205", "Round and Round We Go! What makes Rotary Positional Encodings useful?", "",
          "Barbero, Federico and Vitvitskyi, Alex and Perivolaropoulos, Christos and Pascanu, Razvan "
          "and Veli{\\v{c}}kovi{\\'c}, Petar", 2025, "ICLR", "barbero2025prope",
          presets=("rope2d_p", "rope1d_p", "rope3d_p"),
          claims=(Claim("p-RoPE with p = 0.75 (the lowest quarter of the frequencies dropped) >= RoPE",
                        (("rope2d_p", "rope2d"), ("rope1d_p", "rope1d"), ("rope3d_p", "rope3d")), "base",
                        detail="Table 2: Gemma-2B validation perplexity at the training context, 0.75-RoPE best"),)),
    # a test-time position mode (`riflex`) of the RoPE-ND schemes with a time stream, no preset: its claim (longer
    # videos without repetition, training-free) compares modes of one model, which claims here cannot express
    Paper("2502.15894", "RIFLEx: A Free Lunch for Length Extrapolation in Video Diffusion Transformers",
          "https://github.com/thu-ml/RIFLEx",
          "Zhao, Min and He, Guande and Chen, Yixiao and Zhu, Hongzhou and Li, Chongxuan and Zhu, Jun", 2025, "ICML",
          "zhao2025riflex"),
    # ------------------------------------------------------------------------------------- video / multimodal PEs
    Paper("2409.12191", "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution",
          "https://github.com/QwenLM/Qwen2-VL",
          "Wang, Peng and Bai, Shuai and Tan, Sinan and Wang, Shijie and Fan, Zhihao and Bai, Jinze and others", 2024,
          "", "wang2024qwen2vl", presets=("mrope",)),
    Paper("2502.13923", "Qwen2.5-VL Technical Report", "https://github.com/QwenLM/Qwen2.5-VL",
          "Bai, Shuai and Chen, Keqin and Liu, Xuejing and Wang, Jialin and others", 2025, "", "bai2025qwen25vl",
          presets=("mrope_time",)),
    Paper("2511.21631", "Qwen3-VL Technical Report", "https://github.com/QwenLM/Qwen3-VL",
          "Bai, Shuai and Cai, Yuxuan and Chen, Ruizhe and Chen, Keqin and others", 2025, "", "bai2025qwen3vl",
          presets=("mrope_interleaved",),
          claims=(Claim("Interleaved M-RoPE >= chunked M-RoPE on longer videos than trained on",
                        (("mrope_interleaved", "mrope"),), "beyond", ("frames", "duration")),)),
    Paper("2502.05173", "VideoRoPE: What Makes for Good Video Rotary Position Embedding?",
          "https://github.com/Wiselnn570/VideoRoPE",
          "Wei, Xilin and Liu, Xiaoran and Zang, Yuhang and Dong, Xiaoyi and others", 2025, "ICML",
          "wei2025videorope", presets=("videorope",),
          claims=(Claim("VideoRoPE >= M-RoPE on longer videos than trained on", (("videorope", "mrope"),), "beyond",
                        ("frames", "duration")),)),
    Paper("2502.11664", "VRoPE: Rotary Position Embedding for Video Large Language Models", "",
          "Liu, Zikang and Guo, Longteng and Tang, Yepeng and others", 2025, "", "liu2025vrope", presets=("vrope",),
          claims=(Claim("VRoPE >= M-RoPE on longer videos than trained on", (("vrope", "mrope"),), "beyond",
                        ("frames", "duration")),)),
    Paper("2412.09616",
          "V2PE: Improving Multimodal Long-Context Capability of Vision-Language Models with Variable Visual "
          "Position Encoding", "https://github.com/OpenGVLab/V2PE",
          "Ge, Junqi and Chen, Ziyi and Lin, Jintao and Zhu, Jinguo and others", 2024, "", "ge2024v2pe",
          presets=("v2pe",),
          claims=(Claim("V2PE's smaller visual position increments help long contexts (V2PE >= M-RoPE, 3D RoPE beyond "
                        "the trained length)", (("v2pe", "mrope"), ("v2pe", "rope3d")), "beyond"),)),
    Paper("2505.20444", "HoPE: Hybrid of Position Embedding for Length Generalization in Vision-Language Models",
          "https://github.com/hrlics/HoPE", "Li, Haoran and others", 2025, "NeurIPS", "li2025hope",
          presets=("hope",),
          claims=(Claim("HoPE >= VideoRoPE, M-RoPE on longer videos than trained on",
                        (("hope", "videorope"), ("hope", "mrope")), "beyond", ("frames", "duration")),)),
    Paper("2510.23095", "Revisiting Multimodal Positional Encoding in Vision-Language Models",
          "https://github.com/JJJYmmm/Multimodal-RoPEs",
          "Huang, Jie and Liu, Xuejing and Song, Sibo and Hou, Ruibing and Chang, Hong and Lin, Junyang and Bai, "
          "Shuai", 2026, "ICLR", "huang2026revisiting", presets=("mrope_i", "mhrope"),
          claims=(Claim("MRoPE-I and MHRoPE >= M-RoPE and 1D RoPE on image and video understanding",
                        (("mrope_i", "mrope"), ("mhrope", "mrope"), ("mrope_i", "rope1d"), ("mhrope", "rope1d")),
                        "base", detail="abstract; its tables not checked"),
                  Claim("Spatial reset helps: MRoPE-I >= the same interleaved M-RoPE without it",
                        (("mrope_i", "mrope_interleaved"),), "base",
                        detail="the position design it proposes; its tables not checked"))),
)  # fmt: skip

PAPERS: dict[str, Paper] = {p.arxiv: p for p in _ROWS}

# every claim with its source written from its paper
CLAIMS: tuple[Claim, ...] = tuple(
    Claim(**{**c.__dict__, "source": p.cite() + (f", {c.detail}" if c.detail else "")}) for p in _ROWS for c in p.claims
)


def paper(arxiv: str) -> Paper:
    """The row of an arXiv id ('2403.13298' or 'arXiv:2403.13298')."""
    key = arxiv.removeprefix("arXiv:").strip()
    if key not in PAPERS:
        raise KeyError(f"no paper {arxiv!r} in visionpe.papers; add its row to _ROWS")
    return PAPERS[key]


def preset_papers() -> dict[str, Paper]:
    """PE preset -> the paper that introduces it."""
    return {preset: p for p in _ROWS for preset in p.presets}


def family_paper(family: str) -> Paper:
    """The paper whose architecture a model family is."""
    rows = [p for p in _ROWS if p.family == family]
    if not rows:
        raise KeyError(f"no paper in visionpe.papers names the family {family!r}; give its backbone's row family=")
    return rows[0]


def bibtex(paper_ids: str) -> str | None:
    """The BibTeX entry of 'arXiv:XXXX.XXXXX'; None for an id this table does not know."""
    key = paper_ids.removeprefix("arXiv:").strip()
    return PAPERS[key].bibtex() if key in PAPERS else None
